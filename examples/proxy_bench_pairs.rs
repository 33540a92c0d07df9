//! `proxy_bench`'s pair parts: the 8-byte `put_signal` round trip and the
//! 8-byte message rates, between pairs of ranks on two nodes.
//!
//! Rank `i` of the first node pairs with rank `i` of the second
//! (`ranks / nodes` apart; with two ranks, ranks 0 and 1); the first
//! `--pairs` pairs measure at once, each launch behind one barrier, while
//! the other ranks launch nothing that sends. Each pair's first rank
//! leads the round trip and posts the puts; its partner checks that every
//! put's word holds the value its partner put (a value per poster and
//! launch, so a lost put or one landed on another pair's receiver fails
//! the run). Rank 0 gathers every pair's figures.

use doorbell::comm::{Communicator, SymBuffer};
use doorbell::{DeviceBuffer, Family, FamilyHandle, LaunchConfig, Stream};
use doorbell_example_kernels::ibgda_bench::{lane_words, post_burst, post_lanes, put_signal_rtt, BENCH_OK, NO_PEER};
use doorbell_examples::pairs::Rates;
use doorbell_examples::BoxError;

use super::Plan;

/// One round's figures over one transport: a value per pair, in the
/// order of the plan's pairs.
#[derive(Debug, Default)]
pub struct PairRound {
    /// µs per round trip over the transport, and over P2P where asked.
    pub rtt_us: Vec<f64>,
    pub rtt_p2p_us: Vec<f64>,
    /// Million 8-byte puts a second: one warp's, and `--lane-blocks`
    /// warps' posting a put per lane.
    pub rate: Rates,
    pub lanes: Rates,
}

/// A transport call in the launch failed.
fn check(status: &DeviceBuffer<u32>, what: &str) -> Result<(), BoxError> {
    let s = status.to_host()?[0];
    if s != BENCH_OK && s != 0 {
        return Err(format!("{what}: a transport call failed (status {s})").into());
    }
    Ok(())
}

/// Words of the rate launches' target: a word per put of the message
/// rate and of the lane posts (up to `LANE_WORDS`).
fn words_for(p: &Plan) -> usize {
    (p.wqes as usize).max(lane_words(p.lane_blocks, p.lane_rounds))
}

/// The value rank `poster` puts in the launch of `seed`.
fn value_of(seed: u64, poster: u32) -> u64 {
    seed ^ ((poster as u64 + 1) << 40)
}

/// One rank's buffers and kernel families for the pair parts.
pub struct PairRank<'c> {
    comm: &'c Communicator,
    role: Option<(u32, bool)>,
    pairs: Vec<[u32; 2]>,
    s: Stream,
    rtt: Family<put_signal_rtt>,
    burst: Family<post_burst>,
    lanes: Family<post_lanes>,
    words: SymBuffer<'c, u64>,
    sig: SymBuffer<'c, u64>,
    src: SymBuffer<'c, u64>,
    status: DeviceBuffer<u32>,
    out: DeviceBuffer<u64>,
    epoch: u64,
}

impl<'c> PairRank<'c> {
    /// Buffers (symmetric: every rank allocates them) and the kernels of
    /// `m` (the example kernels' module).
    pub fn new(comm: &'c Communicator, m: &doorbell::Module, p: &Plan) -> Result<Self, BoxError> {
        let dev = comm.device();
        Ok(PairRank {
            comm,
            role: p.pairs.role(comm.rank() as u32),
            pairs: p.pairs.list(),
            s: dev.new_stream()?,
            rtt: m.family::<put_signal_rtt>()?,
            burst: m.family::<post_burst>()?,
            lanes: m.family::<post_lanes>()?,
            words: comm.alloc::<u64>(words_for(p))?,
            sig: comm.alloc::<u64>(1)?,
            src: comm.alloc::<u64>(64)?,
            status: dev.alloc_zeroed::<u32>(1)?,
            out: dev.alloc_zeroed::<u64>(3 * 64)?,
            epoch: 1,
        })
    }

    /// The peer this rank posts to ([`NO_PEER`] unless it leads a pair).
    fn posts_to(&self) -> u32 {
        match self.role {
            Some((peer, true)) => peer,
            _ => NO_PEER,
        }
    }

    /// `mine` (anything where this rank measured nothing) of every rank;
    /// the leaders' words in pair order (collective).
    fn leaders<const N: usize>(&self, mine: [u64; N]) -> Result<Vec<[u64; N]>, BoxError> {
        let bytes: Vec<u8> = mine.iter().flat_map(|w| w.to_le_bytes()).collect();
        let all = self.comm.world().all_gather_bytes(&bytes)?;
        let of = |r: u32| -> Result<[u64; N], BoxError> {
            let b = &all[r as usize];
            if b.len() != 8 * N {
                return Err(format!("rank {r} sent {} bytes of figures, not {}", b.len(), 8 * N).into());
            }
            Ok(std::array::from_fn(|i| {
                u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().expect("8 bytes"))
            }))
        };
        self.pairs.iter().map(|&[lead, _]| of(lead)).collect()
    }

    /// Every pair's round trip, its one warp per rank over `t`, and the
    /// rates, a round over one transport (collective). `p2p`: the round
    /// trip over P2P too. `seed`: this round's put values (each launch
    /// and poster its own).
    pub fn round<T, P>(&mut self, p: &Plan, t: T, p2p: Option<P>, seed: u64) -> Result<PairRound, BoxError>
    where
        T: FamilyHandle<put_signal_rtt, Rest = RttArgs>
            + FamilyHandle<post_burst, Rest = BurstArgs>
            + FamilyHandle<post_lanes, Rest = LanesArgs>
            + Copy,
        P: FamilyHandle<put_signal_rtt, Rest = RttArgs>,
    {
        let rtt_us = self.round_trip(p, t)?;
        let rtt_p2p_us = match p2p {
            Some(h) => self.round_trip(p, h)?,
            None => Vec::new(),
        };
        let rate = self.message_rate(p, t, seed)?;
        let lanes = self.lane_rate(p, t, seed.wrapping_add(0x100_0000))?;
        Ok(PairRound {
            rtt_us,
            rtt_p2p_us,
            rate,
            lanes,
        })
    }

    /// Before a rate launch: receivers zero the words the puts write,
    /// posters fill their source with their value.
    fn prepare(&mut self, seed: u64) -> Result<(), BoxError> {
        self.status.zero()?;
        match self.role {
            Some((_, false)) => self.words.copy_from_host(&vec![0u64; self.words.len()])?,
            Some((_, true)) => self.src.copy_from_host(&[value_of(seed, self.comm.rank() as u32); 64])?,
            None => {}
        }
        self.comm.barrier()?;
        Ok(())
    }

    /// After it: each receiver's first `n` words hold its partner's value,
    /// the others 0.
    fn landed(&self, n: usize, seed: u64, what: &str) -> Result<(), BoxError> {
        self.comm.barrier()?;
        if let Some((partner, false)) = self.role {
            let got = self.words.to_host()?;
            let want = |i: usize| if i < n { value_of(seed, partner) } else { 0 };
            if let Some(i) = (0..got.len()).find(|&i| got[i] != want(i)) {
                let me = self.comm.rank();
                return Err(format!(
                    "{what}: rank {me}'s word {i} holds {:#x}, not rank {partner}'s {:#x}",
                    got[i],
                    want(i)
                )
                .into());
            }
        }
        Ok(())
    }

    /// µs per 8-byte put_signal round trip over `t`, per pair.
    fn round_trip<T>(&mut self, p: &Plan, t: T) -> Result<Vec<f64>, BoxError>
    where
        T: FamilyHandle<put_signal_rtt, Rest = RttArgs>,
    {
        self.status.zero()?;
        self.comm.barrier()?;
        let (peer, leads) = self.role.unwrap_or((NO_PEER, false));
        let a = (
            peer,
            leads as u32,
            self.words.as_mut_ptr(),
            self.sig.as_mut_ptr(),
            self.epoch,
            p.rtt_iters,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` and `sig`; one warp per rank.
        unsafe { self.s.launch_family(&self.rtt, LaunchConfig::linear(1, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "put_signal round trip")?;
        self.epoch += p.rtt_iters as u64 + 1;
        let mine = match leads {
            true => self.out.to_host()?[0] as f64 / 1e3 / p.rtt_iters as f64,
            false => f64::NAN,
        };
        Ok(self.leaders([mine.to_bits()])?.into_iter().map(|[w]| f64::from_bits(w)).collect())
    }

    /// Million 8-byte puts per second by one warp of each pair's leader
    /// over `t`, from its first post to its last completion; partners check
    /// what landed.
    fn message_rate<T>(&mut self, p: &Plan, t: T, seed: u64) -> Result<Rates, BoxError>
    where
        T: FamilyHandle<post_burst, Rest = BurstArgs>,
    {
        self.prepare(seed)?;
        let a = (
            self.posts_to(),
            self.words.as_mut_ptr(),
            self.src.as_ptr(),
            p.wqes,
            1u32,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` of at least `wqes` words, `src` of 64;
        // one warp posts.
        unsafe { self.s.launch_family(&self.burst, LaunchConfig::linear(1, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "message rate")?;
        // Put `i` wrote word `i`: one lost put leaves its word 0.
        self.landed(p.wqes as usize, seed, "message rate")?;
        let mine = match self.posts_to() {
            NO_PEER => [0; 3],
            _ => {
                // Durations from the first post, and its time.
                let ns = self.out.to_host()?;
                let rate = p.wqes as f64 / (ns[1].max(1) as f64 * 1e-9) / 1e6;
                [rate.to_bits(), ns[2], ns[2] + ns[1]]
            }
        };
        Ok(Rates::of(&self.leaders(mine)?, p.wqes as f64))
    }

    /// Million 8-byte puts per second completed by `lane_blocks` warps of
    /// each pair's leader, each lane posting its own put `lane_rounds`
    /// times; partners check what landed.
    fn lane_rate<T>(&mut self, p: &Plan, t: T, seed: u64) -> Result<Rates, BoxError>
    where
        T: FamilyHandle<post_lanes, Rest = LanesArgs>,
    {
        self.prepare(seed)?;
        let a = (
            self.posts_to(),
            self.words.as_mut_ptr(),
            self.src.as_ptr(),
            p.lane_rounds,
            self.out.as_mut_ptr(),
            self.status.as_mut_ptr(),
        );
        // SAFETY: symmetric `words` of at least `lane_words`, `src` of 64; 3 output
        // words per block (at most 64 blocks).
        unsafe { self.s.launch_family(&self.lanes, LaunchConfig::linear(p.lane_blocks, 32), t, a)? };
        self.comm.synchronize(&self.s)?;
        check(&self.status, "lane posts")?;
        // Each put wrote a word of its own (up to LANE_WORDS).
        self.landed(lane_words(p.lane_blocks, p.lane_rounds), seed, "lane posts")?;
        let puts = 32.0 * p.lane_rounds as f64 * p.lane_blocks as f64;
        let mine = match self.posts_to() {
            NO_PEER => [0; 3],
            _ => {
                let ns = self.out.to_host()?;
                let b = p.lane_blocks as usize;
                let t0 = (0..b).map(|k| ns[3 * k]).min().unwrap_or(0);
                let t1 = (0..b).map(|k| ns[3 * k + 2]).max().unwrap_or(0);
                let rate = puts / (t1.saturating_sub(t0).max(1) as f64 * 1e-9) / 1e6;
                [rate.to_bits(), t0, t1]
            }
        };
        Ok(Rates::of(&self.leaders(mine)?, puts))
    }
}

/// The arguments after the transport of [`put_signal_rtt`](fn@put_signal_rtt).
pub type RttArgs = (u32, u32, *mut u64, *mut u64, u64, u32, *mut u64, *mut u32);
/// The same of [`post_burst`](fn@post_burst).
pub type BurstArgs = (u32, *mut u64, *const u64, u32, u32, *mut u64, *mut u32);
/// The same of [`post_lanes`](fn@post_lanes).
pub type LanesArgs = (u32, *mut u64, *const u64, u32, *mut u64, *mut u32);
