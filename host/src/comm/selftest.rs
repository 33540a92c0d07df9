//! The self-test of the routes a communicator uses
//! ([`Communicator::self_test`]): on by default when a communicator forms.
//!
//! Every rank puts a message of [`MSG_WORDS`] words, different for each
//! (sender, receiver, route, run), into every peer's landing area with the
//! transport's typed put and signal (the library kernel `selftest_p2p` /
//! `selftest_ibgda`, [`doorbell_kernels::coll::selftest`]); each rank then
//! waits (bounded by [`CommOptions::wait_timeout`](super::CommOptions::wait_timeout))
//! for every sender's signal and the host compares what landed with what
//! was sent. The verdicts of every rank are gathered, so every rank fails
//! with the same [`Error::SelfTest`] naming the sender, the receiver, the
//! route, what arrived and what was expected.
//!
//! The landing areas lie in a free range of the symmetric heap and are not
//! allocated: user allocations made later zero them.

use std::time::{Duration, Instant};

use doorbell_kernels::coll::selftest::{area_words, message, selftest, SelfTestArgs, MSG_WORDS, ROUTE_IBGDA, ROUTE_P2P};
use doorbell_kernels::transport::Sym;

use super::{Communicator, PeerRoute};
use crate::error::{Error, Result};
use crate::family::AnyTransport;
use crate::launch::LaunchConfig;

/// `DOORBELL_SELF_TEST`: `0` skips the self-test when a communicator forms
/// (where [`CommOptions::self_test`](super::CommOptions::self_test) leaves it to
/// the environment); `1` or unset runs it.
pub const SELF_TEST_ENV: &str = "DOORBELL_SELF_TEST";

/// A route the self-test checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SelfTestRoute {
    /// Load/store into the peers' mapped heaps (the P2P transport): every
    /// peer but those of other hosts.
    P2p,
    /// The NIC (the IBGDA transport, soft NIC or ConnectX): every peer,
    /// once [`Communicator::ibgda`] has set it up.
    Ibgda,
}

impl SelfTestRoute {
    /// The route's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            SelfTestRoute::P2p => "P2P",
            SelfTestRoute::Ibgda => "IBGDA",
        }
    }

    fn number(self) -> u64 {
        match self {
            SelfTestRoute::P2p => ROUTE_P2P,
            SelfTestRoute::Ibgda => ROUTE_IBGDA,
        }
    }
}

impl std::fmt::Display for SelfTestRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Fault injection for tests only: on rank `from`, the route `route` to
/// rank `to` is made to point `skew` bytes past the peer's heap base (the
/// P2P peer table, or the remote address the NIC is given), so bytes sent
/// that way really land in the wrong place (the addition wraps:
/// `n.wrapping_neg()` points `n` bytes before). `skew` must keep the
/// landing inside the peer's heap. Not for use outside tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteFault {
    /// The rank whose route is broken.
    pub from: usize,
    /// The peer it reaches the wrong place of.
    pub to: usize,
    /// Which route.
    pub route: SelfTestRoute,
    /// Bytes added to the peer's base address.
    pub skew: u64,
}

impl RouteFault {
    /// The skew to add on `rank`'s `route` to `peer` (0 when no fault).
    pub(super) fn skew(fault: Option<RouteFault>, rank: usize, peer: usize, route: SelfTestRoute) -> u64 {
        match fault {
            Some(f) if f.from == rank && f.to == peer && f.route == route && peer != rank => {
                tracing::warn!(
                    "rank {rank}: fault injection: the {route} route to rank {peer} is skewed by {} bytes",
                    f.skew
                );
                f.skew
            }
            _ => 0,
        }
    }
}

/// What one run of the self-test checked ([`Communicator::self_test`],
/// [`Communicator::last_self_test`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfTestReport {
    /// The run's nonce, agreed by every rank (mixed into every message).
    pub nonce: u64,
    /// The routes tested, in order.
    pub routes: Vec<SelfTestRoute>,
    /// The messages that arrived at this rank: (route, sender, the words
    /// read from the landing area), one per tested sender.
    pub received: Vec<(SelfTestRoute, usize, [u64; MSG_WORDS as usize])>,
    /// Wall time of the run on this rank (exchange, launches, checks).
    pub elapsed: Duration,
}

/// The self-test's state in a communicator.
#[derive(Default)]
pub(super) struct SelfTestState {
    /// Whether the self-test runs at construction and at IBGDA set-up.
    pub enabled: bool,
    /// The test-only fault.
    pub fault: Option<RouteFault>,
    /// Runs so far (the nonce's counter).
    runs: std::sync::atomic::AtomicU64,
    last: std::sync::Mutex<Option<SelfTestReport>>,
}

impl SelfTestState {
    pub(super) fn new(enabled: bool, fault: Option<RouteFault>) -> SelfTestState {
        SelfTestState {
            enabled,
            fault,
            ..Default::default()
        }
    }
}

/// A message as it arrived: its route, its sender and its words
/// ([`SelfTestReport::received`]).
type Arrival = (SelfTestRoute, usize, [u64; MSG_WORDS as usize]);

/// One failed (sender, receiver) pair, as gathered.
struct Failure {
    route: SelfTestRoute,
    sender: usize,
    receiver: usize,
    expected: String,
    arrived: String,
}

impl Failure {
    fn encode(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}",
            self.route.number(),
            self.sender,
            self.receiver,
            self.expected,
            self.arrived
        )
    }

    fn decode(line: &str) -> Option<Failure> {
        let mut f = line.splitn(5, '\t');
        let route = match f.next()?.parse::<u64>().ok()? {
            ROUTE_P2P => SelfTestRoute::P2p,
            ROUTE_IBGDA => SelfTestRoute::Ibgda,
            _ => return None,
        };
        Some(Failure {
            route,
            sender: f.next()?.parse().ok()?,
            receiver: f.next()?.parse().ok()?,
            expected: f.next()?.to_string(),
            arrived: f.next()?.to_string(),
        })
    }
}

fn words(w: &[u64]) -> String {
    let parts: Vec<String> = w.iter().map(|v| format!("{v:#018x}")).collect();
    format!("[{}]", parts.join(", "))
}

impl Communicator {
    /// Collective: runs the self-test again on every route this
    /// communicator uses — P2P to every peer it reaches by load/store, and
    /// IBGDA to every peer once [`Self::ibgda`] (or [`Self::routed`]) has
    /// set it up — and returns what it checked. A message that did not
    /// arrive as sent is [`Error::SelfTest`] on every rank, naming the
    /// sender, the receiver, the route, what arrived and what was expected.
    /// Runs whatever [`CommOptions::self_test`](super::CommOptions::self_test)
    /// says. No kernel of this rank may be running.
    pub fn self_test(&self) -> Result<SelfTestReport> {
        let ibgda = self.ibgda_if_set_up();
        let mut routes = vec![(SelfTestRoute::P2p, AnyTransport::from(self.p2p_handle()))];
        if let Some(h) = ibgda {
            routes.push((SelfTestRoute::Ibgda, h.into()));
        }
        self.run_self_test(&routes)
    }

    /// The report of the last self-test of this communicator: `None` when
    /// none ran (it was off at construction, and [`Self::self_test`] was
    /// not called).
    pub fn last_self_test(&self) -> Option<SelfTestReport> {
        self.self_test.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether the self-test runs when this communicator forms and when
    /// it sets up IBGDA ([`CommOptions::self_test`](super::CommOptions::self_test)
    /// and `DOORBELL_SELF_TEST`, resolved).
    pub fn self_test_enabled(&self) -> bool {
        self.self_test.enabled
    }

    /// Whether this rank tests `route` to (and from) `peer`.
    fn tests_pair(&self, route: SelfTestRoute, peer: usize) -> bool {
        peer != self.rank && (route == SelfTestRoute::Ibgda || self.routes[peer] != PeerRoute::Remote)
    }

    /// The self-test over `routes` (collective).
    pub(super) fn run_self_test(&self, routes: &[(SelfTestRoute, AnyTransport)]) -> Result<SelfTestReport> {
        let t0 = Instant::now();
        let (me, n) = (self.rank, self.size);
        let module = self.library_module()?;
        let family = module.family::<selftest>()?;
        let stream = self.device.new_stream()?;
        let area_bytes = (area_words(n as u64) * 8).next_multiple_of(256);
        // A free range of the heap, which no allocation may take meanwhile.
        let map = self.heap_map.lock().unwrap_or_else(|p| p.into_inner());
        let need = area_bytes * routes.len() as u64;
        let placed = map.place(need);
        let (start, fits) = (placed.unwrap_or(0), placed.is_ok());

        // Agree on the nonce (rank 0's), and check that every rank tests
        // the same routes at the same offset with room for them.
        let run = self.self_test.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let proposal = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ ((std::process::id() as u64) << 32)
            ^ run.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut mine = proposal.to_le_bytes().to_vec();
        mine.extend_from_slice(&start.to_le_bytes());
        mine.push(fits as u8);
        mine.extend(routes.iter().map(|(r, _)| r.number() as u8));
        let all = self.world.all_gather_bytes(&mine)?;
        for (r, b) in all.iter().enumerate() {
            if b.get(8..) != mine.get(8..) {
                return Err(Error::comm(format!(
                    "rank {me}: self-test: rank {r} tests other routes, or at another heap offset, or has no room for \
                     them (ranks must make the same allocations and set up the same transports)"
                )));
            }
        }
        if let Err(largest) = placed {
            return Err(Error::comm(format!(
                "rank {me}: the self-test needs {need} bytes of free symmetric heap in one range, the largest free \
                 range holds {largest} (heap of {} bytes); make CommOptions::heap_bytes larger, or turn the self-test off",
                self.heap_len
            )));
        }
        let nonce = u64::from_le_bytes(all[0][..8].try_into().expect("8 bytes")) | 1;

        // Prepare every area: zeroed, the peers to send to flagged, the
        // signals of senders that send nothing here already set.
        let nw = n as u64;
        for (k, (route, _)) in routes.iter().enumerate() {
            let mut area = vec![0u64; area_words(nw) as usize];
            for p in 0..n {
                if self.tests_pair(*route, p) {
                    area[(nw * (2 * MSG_WORDS + 1)) as usize + p] = 1;
                } else {
                    area[(nw * MSG_WORDS) as usize + p] = nonce;
                }
            }
            let bytes: Vec<u8> = area.iter().flat_map(|w| w.to_le_bytes()).collect();
            // SAFETY: inside this rank's heap (checked above), in a free range.
            unsafe { self.device.write_raw(self.heap_base + start + k as u64 * area_bytes, &bytes)? };
        }
        // Every rank's areas are ready (and its module loaded) before any puts.
        self.world.barrier()?;
        // The library's own launches: not counted as the user's (a peer's
        // "who is stuck" names the user's kernels).
        let synced = self.device.activity().unrecorded(|| {
            let mut launched = Ok(());
            for (k, (route, t)) in routes.iter().enumerate() {
                let args = SelfTestArgs {
                    area: Sym::from_raw((self.heap_base + start + k as u64 * area_bytes) as *mut u64, area_words(nw)),
                    nonce,
                    route: route.number(),
                };
                // SAFETY: the area is prepared on every rank; one block of one thread.
                launched = unsafe { stream.launch_family(&family, LaunchConfig::linear(1, 1), *t, (args,)) };
                if launched.is_err() {
                    break;
                }
            }
            launched.and_then(|()| stream.synchronize())
        });
        // A wait that ran out left a report: it is part of this verdict.
        let device = synced.and_then(|()| self.check());

        // Check what landed here.
        let (received, failures) = self.self_test_arrivals(routes, start, area_bytes, nonce)?;
        drop(map);
        self.self_test_verdict(&failures, &device)?;
        // Every message arrived; a device error (none expected) still fails.
        device?;
        let report = SelfTestReport {
            nonce,
            routes: routes.iter().map(|(r, _)| *r).collect(),
            received,
            elapsed: t0.elapsed(),
        };
        tracing::info!(
            "rank {me}: self-test passed: {} route(s), {} message(s) received, {:.3} ms",
            report.routes.len(),
            report.received.len(),
            report.elapsed.as_secs_f64() * 1e3
        );
        *self.self_test.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.clone());
        Ok(report)
    }

    /// The messages and signals that landed in this rank's areas (one per
    /// route, `area_bytes` apart from heap offset `start`), each checked
    /// against what its sender was to write: what arrived, and the
    /// failures.
    fn self_test_arrivals(
        &self,
        routes: &[(SelfTestRoute, AnyTransport)],
        start: u64,
        area_bytes: u64,
        nonce: u64,
    ) -> Result<(Vec<Arrival>, Vec<Failure>)> {
        let (me, n) = (self.rank, self.size);
        let nw = n as u64;
        let mut received = Vec::new();
        let mut failures = Vec::new();
        for (k, (route, _)) in routes.iter().enumerate() {
            let mut raw = vec![0u8; (nw * (MSG_WORDS + 1) * 8) as usize];
            // SAFETY: the area's messages and signals, in this rank's heap.
            unsafe { self.device.read_raw(self.heap_base + start + k as u64 * area_bytes, &mut raw)? };
            let got: Vec<u64> = raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8"))).collect();
            for s in (0..n).filter(|&s| self.tests_pair(*route, s)) {
                let msg: [u64; MSG_WORDS as usize] = got[s * MSG_WORDS as usize..][..MSG_WORDS as usize].try_into().expect("words");
                let want: Vec<u64> = (0..MSG_WORDS)
                    .map(|i| message(nonce, s as u64, me as u64, route.number(), i))
                    .collect();
                let signal = got[(nw * MSG_WORDS) as usize + s];
                received.push((*route, s, msg));
                if msg[..] == want[..] && signal == nonce {
                    continue;
                }
                let mut arrived = format!("message {} with signal {signal:#x}", words(&msg));
                if signal != nonce {
                    arrived.push_str(" (the signal never came: the bounded wait ran out)");
                }
                if let Some(whose) = self.whose_message(nonce, &msg) {
                    arrived.push_str(&format!(" — {whose}"));
                }
                failures.push(Failure {
                    route: *route,
                    sender: s,
                    receiver: me,
                    expected: format!("message {} with signal {nonce:#x}", words(&want)),
                    arrived,
                });
            }
        }
        Ok((received, failures))
    }

    /// The verdict of every rank (collective): the first failure of any
    /// rank as [`Error::SelfTest`], naming the others and the devices'
    /// reports; `Ok` when every message of every rank arrived.
    fn self_test_verdict(&self, failures: &[Failure], device: &Result<()>) -> Result<()> {
        let lines: Vec<String> = failures.iter().map(Failure::encode).collect();
        let dev_note = device.as_ref().err().map(|e| e.to_string());
        let mut note = lines.join("\n");
        note.push('\u{1}');
        note.push_str(dev_note.as_deref().unwrap_or(""));
        let gathered = self.world.all_gather_bytes(note.as_bytes())?;
        let mut all_failures = Vec::new();
        let mut device_errors = Vec::new();
        for g in &gathered {
            let text = String::from_utf8_lossy(g);
            let (fails, dev) = text.split_once('\u{1}').unwrap_or((&text, ""));
            all_failures.extend(fails.lines().filter_map(Failure::decode));
            if !dev.is_empty() {
                device_errors.push(dev.to_string());
            }
        }
        if let Some(first) = all_failures.first() {
            let mut more = String::new();
            if all_failures.len() > 1 {
                let others: Vec<String> = all_failures[1..]
                    .iter()
                    .map(|f| format!("rank {} -> rank {} over {}", f.sender, f.receiver, f.route))
                    .collect();
                more.push_str(&format!("; also failed: {}", others.join(", ")));
            }
            if !device_errors.is_empty() {
                more.push_str(&format!("; device reports: {}", device_errors.join("; ")));
            }
            return Err(Error::SelfTest {
                sender: first.sender,
                receiver: first.receiver,
                route: first.route.name(),
                expected: first.expected.clone(),
                arrived: first.arrived.clone(),
                more,
            });
        }
        Ok(())
    }

    /// Names the (sender, receiver, route) whose message `msg` is, if any.
    fn whose_message(&self, nonce: u64, msg: &[u64]) -> Option<String> {
        if msg.iter().all(|&w| w == 0) {
            return Some("nothing arrived".to_string());
        }
        for route in [SelfTestRoute::P2p, SelfTestRoute::Ibgda] {
            for s in 0..self.size as u64 {
                for d in 0..self.size as u64 {
                    if (0..MSG_WORDS).all(|i| msg[i as usize] == message(nonce, s, d, route.number(), i)) {
                        return Some(format!("the message of rank {s} to rank {d} over {route}"));
                    }
                }
            }
        }
        None
    }
}
