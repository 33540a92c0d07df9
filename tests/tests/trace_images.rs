//! Which image of a kernel crate a load takes (`doorbell::ModuleImage`):
//! a build with `DOORBELL_TRACE_KERNELS=1` embeds the default image and
//! one with the trace's hooks, and a process that has not asked for
//! tracing must load the default one (the code of a build without the
//! hooks); tracing started after a module was loaded still records what
//! it can and names the modules that cannot.
//!
//! One test function: tracing, once started, is requested for the whole
//! process, so the "off" half must run before any trace starts.

use std::time::Duration;

use doorbell::comm::{CommOptions, Communicator};
use doorbell::trace::{loaded_without_hooks, tracing_requested, TraceOptions};
use doorbell::{Device, ImageChoice, ModuleImage, ModuleSource};
use doorbell_tests::{PipeByLaunch, TEST_KERNELS};

const ELEMS: u64 = 3000;
const CHUNK: u64 = 512;

/// With tracing off, every image loads as its default one: never the
/// traced PTX, whose hooks cost even when off.
fn tracing_off_takes_the_default_image() {
    assert!(
        std::env::var_os(doorbell::trace::TRACE_ENV).is_none_or(|v| v.is_empty()),
        "run this test without DOORBELL_TRACE"
    );
    assert!(!tracing_requested(), "nothing asked for tracing in this process yet");
    let both = ModuleImage {
        traced_ptx: "// traced",
        traced_cubin: b"traced",
        ..ModuleImage::new("both", "// default", b"default")
    };
    let off = ModuleSource::from(&both).select(tracing_requested());
    assert_eq!(
        (off.ptx, off.cubin, off.choice),
        ("// default", &b"default"[..], ImageChoice::Default)
    );
    let on = ModuleSource::from(&both).select(true);
    assert_eq!((on.ptx, on.cubin, on.choice), ("// traced", &b"traced"[..], ImageChoice::Traced));
    // The images this build embeds: with tracing off, the default one, and
    // in a build with DOORBELL_TRACE_KERNELS=1 that one has no recorder.
    for image in [TEST_KERNELS, doorbell::KERNELS, doorbell::comm::SOFTNIC] {
        let s = ModuleSource::from(&image).select(tracing_requested());
        assert_eq!(
            s.ptx.as_ptr(),
            image.ptx.as_ptr(),
            "{}: tracing off must load the default image",
            image.name
        );
        if image.has_traced() {
            assert_eq!(s.choice, ImageChoice::Default);
            assert!(
                !s.ptx.contains("trace_record"),
                "{}: the default image has the trace's hooks",
                image.name
            );
            if image.name != "doorbell_softnic" {
                // The engine records through its own function.
                assert!(
                    image.traced_ptx.contains("trace_record"),
                    "{}: the traced image has no recorder",
                    image.name
                );
            }
        } else {
            eprintln!("{}: no traced image in this build (DOORBELL_TRACE_KERNELS=1 makes one)", image.name);
        }
    }
}

/// On each backend: the test kernels loaded with tracing off, then tracing
/// started. The emulator records them anyway; a GPU with a traced image
/// built loaded the default one, and the module is named as not traced.
fn tracing_started_after_a_load(dev: &Device) {
    let backend = dev.backend();
    let dir = std::env::temp_dir().join(format!("doorbell-trace-images-{}-{backend:?}", std::process::id()));
    let opts = CommOptions {
        heap_bytes: 8 << 20,
        wait_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let events = Communicator::local(2, backend, opts, |comm| {
        let module = comm.load_module(&TEST_KERNELS)?;
        comm.trace_start(TraceOptions::new(&dir))?;
        assert!(tracing_requested());
        // The P2P handle after trace_start: it carries the trace word.
        let pipe = PipeByLaunch::new(comm, &module, CHUNK, 2, ELEMS)?;
        comm.barrier()?;
        pipe.launch()?;
        comm.synchronize(&pipe.stream)?;
        assert_eq!(pipe.wrong_values(comm, 0)?, 0, "rank {}: wrong values", comm.rank());
        Ok(comm.trace_events().len())
    })
    .unwrap_or_else(|e| panic!("{backend:?}: {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let named = loaded_without_hooks().contains(&"doorbell_test_kernels".to_string());
    if !dev.is_gpu() {
        // The emulator always records, whenever the module was loaded.
        assert!(events.iter().all(|&n| n > 0), "emulator: events per rank {events:?}");
    } else if TEST_KERNELS.has_traced() {
        // The default image was loaded: no pipeline event from it, and the
        // module is named (trace_start warned).
        assert!(
            named,
            "GPU: the test kernels, loaded untraced, are not named: {:?}",
            loaded_without_hooks()
        );
    } else {
        // One image (none traced, or traced only): nothing to name.
        assert!(!named, "{:?}", loaded_without_hooks());
    }
}

#[test]
fn the_traced_image_loads_only_when_tracing_is_requested() {
    tracing_off_takes_the_default_image();
    // The GPU first: once the emulator's run starts tracing, every later
    // load of this process takes the traced image.
    for dev in doorbell_tests::backends().iter().rev() {
        tracing_started_after_a_load(dev);
    }
}
