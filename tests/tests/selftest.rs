//! The communicator's self-test (CPU emulator, thread worlds): it passes on
//! 2 and 4 ranks with every message really exchanged, a route broken on
//! purpose (a peer mapping skewed, so bytes land in the wrong place) fails
//! construction or `self_test()` naming the sender, the receiver and the
//! route, `DOORBELL_SELF_TEST=0` and the option skip it, and a bad value of
//! the variable is an error naming it.

use std::time::{Duration, Instant};

use doorbell::comm::{CommOptions, Communicator, RouteFault, SelfTestRoute, SELF_TEST_ENV};
use doorbell::{Backend, Error};
use doorbell_kernels::coll::selftest::{message, MSG_WORDS, ROUTE_IBGDA, ROUTE_P2P};

fn opts(self_test: Option<bool>, fault: Option<RouteFault>) -> CommOptions {
    CommOptions {
        heap_bytes: 1 << 20,
        wait_timeout: Duration::from_millis(500),
        self_test,
        route_fault: fault,
        ..Default::default()
    }
}

/// Every rank received, over `route`, the message of every other rank to
/// it, word for word; every rank agrees on the nonce.
fn assert_exchanged(reports: &[doorbell::comm::SelfTestReport], route: SelfTestRoute, number: u64) {
    let n = reports.len();
    let nonce = reports[0].nonce;
    for (me, r) in reports.iter().enumerate() {
        assert_eq!(r.nonce, nonce, "rank {me} agreed on another nonce");
        assert!(r.routes.contains(&route), "rank {me}: {:?}", r.routes);
        let got: Vec<_> = r.received.iter().filter(|(rt, _, _)| *rt == route).collect();
        let senders: Vec<usize> = got.iter().map(|(_, s, _)| *s).collect();
        let want: Vec<usize> = (0..n).filter(|&s| s != me).collect();
        assert_eq!(senders, want, "rank {me}: senders over {route}");
        for (_, s, words) in got {
            for i in 0..MSG_WORDS {
                assert_eq!(
                    words[i as usize],
                    message(nonce, *s as u64, me as u64, number, i),
                    "rank {me}: word {i} of rank {s}'s message over {route}"
                );
            }
            // Rank-specific: no two senders' messages alike.
            assert_ne!(words[0], message(nonce, *s as u64, me as u64, number ^ 3, 0));
        }
    }
}

#[test]
fn self_test_passes_on_2_and_4_ranks_and_every_message_is_exchanged() {
    // The emulator, and the GPU where there is one (required with DOORBELL_TEST_REQUIRE_GPU=1).
    for (n, backend) in [2, 4]
        .into_iter()
        .flat_map(|n| doorbell_tests::backends().into_iter().map(move |d| (n, d.backend())))
    {
        let reports = Communicator::local(n, backend, opts(Some(true), None), |comm| {
            assert!(comm.self_test_enabled());
            let first = comm.last_self_test().expect("ran at construction");
            // Again, on demand: a new nonce, every message again.
            let again = comm.self_test()?;
            assert_ne!(again.nonce, first.nonce, "rank {}: a new run has a new nonce", comm.rank());
            assert_eq!(comm.last_self_test(), Some(again.clone()));
            Ok((first, again))
        })
        .unwrap();
        let (first, again): (Vec<_>, Vec<_>) = reports.into_iter().unzip();
        assert_exchanged(&first, SelfTestRoute::P2p, ROUTE_P2P);
        assert_exchanged(&again, SelfTestRoute::P2p, ROUTE_P2P);
    }
}

#[test]
fn a_broken_p2p_route_fails_construction_naming_sender_receiver_and_route() {
    let cases = [(2, 0, 1), (4, 2, 3), (4, 3, 0)];
    for ((n, from, to), backend) in cases
        .into_iter()
        .flat_map(|c| doorbell_tests::backends().into_iter().map(move |d| (c, d.backend())))
    {
        let fault = RouteFault {
            from,
            to,
            route: SelfTestRoute::P2p,
            skew: 4096,
        };
        let t0 = Instant::now();
        let err = Communicator::local(n, backend, opts(Some(true), Some(fault)), |_| Ok(())).unwrap_err();
        eprintln!("{backend:?}, {n} ranks, route {from} -> {to} broken: {err}");
        match &err {
            Error::SelfTest {
                sender,
                receiver,
                route,
                arrived,
                more,
                ..
            } => {
                assert_eq!((*sender, *receiver, *route), (from, to, "P2P"), "{err}");
                assert!(arrived.contains("signal 0x0"), "{err}");
                // Only that pair: every other message arrived.
                assert!(!more.contains("also failed"), "{err}");
            }
            e => panic!("not a self-test error: {e}"),
        }
        let text = err.to_string();
        assert!(
            text.contains(&format!("rank {from} sent to rank {to} over the P2P route")),
            "{text}"
        );
        assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
    }
}

/// The fault moves real bytes: with the self-test off at construction,
/// rank 0's mapping of rank 1 is skewed back onto a buffer allocated
/// before the self-test's area, so `self_test()` fails and rank 1 finds
/// rank 0's message in that buffer.
#[test]
fn a_broken_route_puts_the_message_in_the_wrong_place_and_self_test_names_it() {
    const PROBE: usize = 1024;
    let fault = RouteFault {
        from: 0,
        to: 1,
        route: SelfTestRoute::P2p,
        skew: ((PROBE * 8) as u64).wrapping_neg(),
    };
    let out = Communicator::local(2, Backend::Cpu, opts(Some(false), Some(fault)), |comm| {
        assert!(!comm.self_test_enabled());
        assert_eq!(comm.last_self_test(), None, "skipped at construction");
        let probe = comm.alloc::<u64>(PROBE)?;
        let err = comm.self_test().unwrap_err();
        comm.barrier()?;
        Ok((err.to_string(), probe.to_host()?))
    })
    .unwrap();
    for (rank, (err, _)) in out.iter().enumerate() {
        assert!(
            err.contains("the message rank 0 sent to rank 1 over the P2P route did not arrive as sent"),
            "rank {rank}: {err}"
        );
    }
    let (err, probe) = &out[1];
    // The message's words are those the error expected, at the skewed place.
    assert!(probe[..MSG_WORDS as usize].iter().all(|&w| w != 0), "{probe:?}");
    for w in &probe[..MSG_WORDS as usize] {
        assert!(err.contains(&format!("{w:#018x}")), "{w:#x} not in {err}");
    }
    assert!(out[0].1.iter().all(|&w| w == 0), "nothing landed in rank 0's probe");
}

#[test]
fn ibgda_set_up_runs_the_self_test_of_the_nic_route() {
    let reports = Communicator::local(2, Backend::Cpu, opts(Some(true), None), |comm| {
        comm.ibgda()?;
        let r = comm.last_self_test().expect("ran at IBGDA set-up");
        assert_eq!(r.routes, vec![SelfTestRoute::Ibgda]);
        let both = comm.self_test()?;
        assert_eq!(both.routes, vec![SelfTestRoute::P2p, SelfTestRoute::Ibgda]);
        Ok((r, both))
    })
    .unwrap();
    let (first, both): (Vec<_>, Vec<_>) = reports.into_iter().unzip();
    assert_exchanged(&first, SelfTestRoute::Ibgda, ROUTE_IBGDA);
    assert_exchanged(&both, SelfTestRoute::Ibgda, ROUTE_IBGDA);
    assert_exchanged(&both, SelfTestRoute::P2p, ROUTE_P2P);
}

#[test]
fn a_broken_ibgda_route_fails_its_set_up_naming_sender_receiver_and_route() {
    let fault = RouteFault {
        from: 1,
        to: 0,
        route: SelfTestRoute::Ibgda,
        skew: 4096,
    };
    let out = Communicator::local(2, Backend::Cpu, opts(Some(true), Some(fault)), |comm| {
        // The P2P route is intact: construction passed.
        assert!(comm.last_self_test().is_some());
        let err = comm.ibgda().map(|_| ()).unwrap_err();
        // The failed route is torn down, not left in use.
        assert!(comm.soft_nic().is_none(), "rank {}: IBGDA still set up", comm.rank());
        Ok(err)
    })
    .unwrap();
    for (rank, err) in out.iter().enumerate() {
        eprintln!("rank {rank}: {err}");
        match err {
            Error::SelfTest {
                sender, receiver, route, ..
            } => assert_eq!((*sender, *receiver, *route), (1, 0, "IBGDA"), "{err}"),
            e => panic!("rank {rank}: not a self-test error: {e}"),
        }
    }
}

/// The self-test's landing areas take a free range of the heap, not
/// allocated: with the heap full it is an error naming what it needs and
/// the largest free range; once the full buffer is dropped on every rank
/// (and taken back by the next allocation) it runs in the space freed,
/// leaving the buffer allocated meanwhile untouched.
#[test]
fn the_self_test_lands_in_a_free_range_of_the_heap() {
    let out = Communicator::local(2, Backend::Cpu, opts(Some(true), None), |comm| {
        let user = (comm.heap_bytes() - doorbell_kernels::heap::HEAP_RESERVED) as usize;
        let full = comm.alloc::<u8>(user)?;
        let refused = comm.self_test().err().map(|e| e.to_string());
        drop(full);
        let kept = comm.alloc::<u8>(4096)?;
        kept.copy_from_host(&[0x5a; 4096])?;
        let passed = comm.self_test().is_ok();
        let untouched = kept.to_host()?.iter().all(|&b| b == 0x5a);
        Ok((refused, passed, untouched))
    })
    .unwrap();
    for (r, (refused, passed, untouched)) in out.iter().enumerate() {
        let refused = refused.as_deref().unwrap_or("it ran");
        assert!(
            refused.contains("free symmetric heap in one range") && refused.contains("the largest free range holds 0"),
            "rank {r}: {refused}"
        );
        assert!(passed, "rank {r}: the self-test in the freed space");
        assert!(untouched, "rank {r}: the self-test wrote into a live buffer");
    }
}

/// The variable: `0` skips the self-test (nothing ran), `1` runs it, a
/// bad value is an error naming it; an explicit option wins. One test, as
/// it sets a process-wide variable (the other tests set the option).
#[test]
fn the_variable_turns_the_self_test_off_and_a_bad_value_names_it() {
    let ran = |o: CommOptions| {
        Communicator::local(2, Backend::Cpu, o, |comm| {
            Ok((comm.self_test_enabled(), comm.last_self_test().is_some()))
        })
    };
    std::env::set_var(SELF_TEST_ENV, "0");
    assert_eq!(ran(opts(None, None)).unwrap(), vec![(false, false); 2]);
    assert_eq!(CommOptions::from_env().unwrap().self_test, Some(false));
    // A broken route goes unnoticed when the self-test is off.
    let fault = RouteFault {
        from: 0,
        to: 1,
        route: SelfTestRoute::P2p,
        skew: 4096,
    };
    assert_eq!(ran(opts(None, Some(fault))).unwrap(), vec![(false, false); 2]);
    // The option wins over the variable.
    assert_eq!(ran(opts(Some(true), None)).unwrap(), vec![(true, true); 2]);
    std::env::set_var(SELF_TEST_ENV, "1");
    assert_eq!(ran(opts(None, None)).unwrap(), vec![(true, true); 2]);
    assert_eq!(ran(opts(Some(false), None)).unwrap(), vec![(false, false); 2]);
    for bad in ["yes", "2", "off"] {
        std::env::set_var(SELF_TEST_ENV, bad);
        let err = ran(opts(None, None)).unwrap_err();
        assert!(matches!(&err, Error::BadEnv { var, .. } if var == SELF_TEST_ENV), "{err}");
        assert!(err.to_string().contains(SELF_TEST_ENV) && err.to_string().contains(bad), "{err}");
        let err = CommOptions::from_env().unwrap_err();
        assert!(err.to_string().contains(SELF_TEST_ENV), "{err}");
        let err = doorbell::env::check().unwrap_err();
        assert!(err.to_string().contains(SELF_TEST_ENV), "{err}");
    }
    std::env::remove_var(SELF_TEST_ENV);
}

/// The start-up cost: construction with and without the self-test, and
/// the self-test's own time, on 2 and 4 thread ranks. Prints the figures
/// (run with `--ignored --nocapture`).
#[test]
#[ignore = "a measurement: run it with --ignored --nocapture"]
fn self_test_startup_cost() {
    const RUNS: usize = 40;
    for (n, backend) in [2, 4]
        .into_iter()
        .flat_map(|n| doorbell_tests::backends().into_iter().map(move |d| (n, d.backend())))
    {
        let mut with = Vec::new();
        let mut without = Vec::new();
        let mut own = Vec::new();
        for _ in 0..RUNS {
            // Alternated, so a slower stretch of the machine hits both.
            let order = if with.len() % 2 == 0 { [true, false] } else { [false, true] };
            for on in order {
                let t0 = Instant::now();
                let r = Communicator::local(n, backend, opts(Some(on), None), |comm| {
                    Ok(comm.last_self_test().map(|r| r.elapsed))
                })
                .unwrap();
                let took = t0.elapsed();
                if on {
                    with.push(took);
                    own.push(r.into_iter().flatten().max().unwrap());
                } else {
                    without.push(took);
                }
            }
        }
        let median = |v: &mut Vec<Duration>| {
            v.sort();
            v[v.len() / 2].as_secs_f64() * 1e3
        };
        println!(
            "{backend:?}, {n} ranks: Communicator::local with the self-test {:.2} ms, without {:.2} ms (medians of {RUNS}); \
             the self-test itself {:.2} ms (slowest rank, median)",
            median(&mut with),
            median(&mut without),
            median(&mut own)
        );
    }
}
