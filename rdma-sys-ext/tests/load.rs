//! Run-time loading: works where rdma-core is installed, fails cleanly
//! where it is not. No RDMA device is needed.

use std::sync::Arc;

use rdma_sys_ext::{DeviceList, Error, Verbs, LIBIBVERBS};

#[test]
fn load_or_clean_failure() {
    match Verbs::load() {
        Ok(verbs) => {
            let verbs = Arc::new(verbs);
            // Without an RDMA device (and usually without RDMA in the
            // kernel) the list is empty, not an error.
            let list = DeviceList::new(&verbs).expect("device list");
            if list.is_empty() {
                assert_eq!(list.len(), 0);
                assert!(list.iter().next().is_none());
                assert!(list.open(0).is_none());
                assert!(list.open_by_name("mlx5_0").is_none());
            } else {
                // A machine with devices: names and GUIDs resolve.
                for dev in list.iter() {
                    let dev = dev.expect("device info");
                    assert!(!dev.name.is_empty());
                }
            }
            println!("{verbs:?}, {} device(s): {list:?}", list.len());
        }
        Err(e @ Error::LibraryNotFound { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(LIBIBVERBS), "{msg}");
            assert!(msg.contains("ibverbs-providers"), "{msg}");
            eprintln!("rdma-core absent, as reported: {msg}");
        }
        Err(e) => panic!("unexpected load error: {e}"),
    }
}

#[test]
fn missing_library_is_reported_with_the_fix() {
    let err =
        Verbs::load_sonames("libdoorbell-no-such-ibverbs.so.1", "libmlx5.so.1").expect_err("a library that does not exist cannot load");
    match &err {
        Error::LibraryNotFound { library, .. } => {
            assert_eq!(*library, "libdoorbell-no-such-ibverbs.so.1")
        }
        other => panic!("wrong variant: {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("cannot load libdoorbell-no-such-ibverbs.so.1"), "{msg}");
    assert!(msg.contains("apt-get install libibverbs1 ibverbs-providers"), "{msg}");
    // The loader's own message is kept as the error source.
    assert!(std::error::Error::source(&err).is_some());
}

#[test]
fn missing_mlx5_leaves_ibverbs_usable() {
    let Ok(verbs) = Verbs::load_sonames(LIBIBVERBS, "libdoorbell-no-such-mlx5.so.1") else {
        eprintln!("libibverbs absent: nothing to test");
        return;
    };
    assert!(!verbs.has_mlx5());
    assert!(verbs.mlx5_load_error().is_some());
    let err = verbs.mlx5_fns().map(|_| ()).expect_err("mlx5 not loaded");
    assert!(matches!(err, Error::Mlx5Unavailable { .. }), "{err:?}");
    assert!(err.to_string().contains("libmlx5.so.1 is not loaded"));
    // SAFETY: the call fails on the missing library before it looks at the
    // (null) context pointer.
    let err = unsafe { verbs.mlx5dv_query_device(std::ptr::null_mut(), 0) }.unwrap_err();
    assert!(matches!(err, Error::Mlx5Unavailable { .. }), "{err:?}");
    // libibverbs itself still works.
    let verbs = Arc::new(verbs);
    DeviceList::new(&verbs).expect("device list without libmlx5");
}

#[test]
fn installed_rdma_core_has_what_ibgda_needs() {
    let Ok(verbs) = Verbs::load() else {
        eprintln!("rdma-core absent: nothing to test");
        return;
    };
    let fns = verbs.ibverbs_fns();
    assert!(fns.ibv_get_device_list.is_ok());
    assert!(fns.ibv_query_port.is_ok());
    assert!(fns.ibv_reg_mr.is_ok());
    // Debian 12 ships rdma-core 44: dma-buf MRs (34+) are there.
    println!("ibv_reg_dmabuf_mr present: {}", verbs.has_reg_dmabuf_mr());
    if verbs.has_mlx5() {
        let m = verbs.mlx5_fns().unwrap();
        assert!(m.mlx5dv_init_obj.is_ok());
        assert!(m.mlx5dv_devx_alloc_uar.is_ok());
        assert!(m.mlx5dv_devx_umem_reg.is_ok());
    }
}
