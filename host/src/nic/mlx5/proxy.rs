//! CPU-assisted doorbells: where the GPU cannot map the UAR page, each QP
//! rings a word of mapped host memory instead, and a host thread copies
//! every new value written there to the UAR doorbell register.
//!
//! The GPU writes its doorbell word (the first 8 bytes of the last WQE's
//! control segment, never zero) after its WQEs and doorbell record are
//! visible system-wide; the thread forwards the latest value it sees,
//! which makes the NIC process every WQE up to the doorbell record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::Shared;
use crate::error::{Error, Result};
use crate::MappedBuffer;

/// QPs one port can give CPU-assisted doorbells.
pub const SLOTS: usize = 1024;
/// u64 words per slot (a slot is a 64-byte line of its own).
const WORDS: usize = 8;

/// The doorbell words and which are in use.
pub(super) struct ProxyTable {
    words: MappedBuffer<u64>,
    used: Vec<bool>,
}

impl ProxyTable {
    pub(super) fn new(device: &crate::Device) -> Result<ProxyTable> {
        Ok(ProxyTable {
            words: device.alloc_mapped::<u64>(SLOTS * WORDS)?,
            used: vec![false; SLOTS],
        })
    }

    pub(super) fn claim(&mut self) -> Option<usize> {
        let i = self.used.iter().position(|u| !u)?;
        self.used[i] = true;
        self.words.write(i * WORDS, 0);
        Some(i)
    }

    pub(super) fn release(&mut self, slot: usize) {
        if let Some(u) = self.used.get_mut(slot) {
            *u = false;
        }
    }

    pub(super) fn device_word(&self, slot: usize) -> u64 {
        // SAFETY: in bounds (slot < SLOTS).
        unsafe { self.words.device_ptr().add(slot * WORDS) as u64 }
    }
}

/// The forwarding thread.
pub(super) struct Proxy {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Proxy {
    pub(super) fn start(shared: Arc<Shared>) -> Result<Proxy> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mlx5-doorbell".into())
            .spawn(move || run(&shared, &flag))
            .map_err(Error::Thread)?;
        Ok(Proxy {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits (up to 5 s) for it.
    pub(super) fn stop(mut self) -> std::result::Result<(), String> {
        self.stop.store(true, Ordering::Release);
        let Some(t) = self.thread.take() else { return Ok(()) };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !t.is_finished() {
            if std::time::Instant::now() > deadline {
                return Err("the CPU-assisted doorbell thread did not stop within 5 s".to_string());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        t.join().map_err(|_| "the CPU-assisted doorbell thread panicked".to_string())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

fn run(shared: &Shared, stop: &AtomicBool) {
    let reg = shared.uar_reg();
    let mut last = vec![0u64; SLOTS];
    let mut idle = 0u32;
    while !stop.load(Ordering::Acquire) {
        let mut any = false;
        {
            let t = shared.proxy.lock().unwrap_or_else(|p| p.into_inner());
            let Some(t) = t.as_ref() else { return };
            for (slot, used) in t.used.iter().enumerate() {
                if !used {
                    continue;
                }
                let v = t.words.read(slot * WORDS);
                if v == 0 {
                    // A fresh slot (claimed again after a QP was dropped).
                    last[slot] = 0;
                } else if v != last[slot] {
                    last[slot] = v;
                    std::sync::atomic::fence(Ordering::SeqCst);
                    // SAFETY: the UAR register is mapped for the port's life
                    // (Shared outlives this thread); an 8-byte store is how
                    // an mlx5 doorbell is rung.
                    unsafe { std::ptr::write_volatile(reg, v) };
                    any = true;
                }
            }
        }
        if any {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if idle > 1000 {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
