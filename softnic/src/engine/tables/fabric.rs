//! The fabric as an engine reaches it: the [`Ports`] of a fabric, either a
//! slice of ports of one address space or a [`PortTable`] of pointers with
//! a [`Window`] per port (a port of another process, reached through the
//! mapping of its heap).

use super::{Port, MAX_PORTS};

/// The ports of a fabric as the engine sees them: port `i` is the port with
/// LID `i + 1`. Two layouts: a slice (the host wrapper keeps every port in
/// one `Vec`), and a [`PortTable`] of pointers (a GPU-resident engine keeps
/// each port in its owner's device memory, peers' ports reached over the
/// same peer mappings as the heaps).
pub trait Ports {
    /// Port `i`, if it exists.
    fn get(&self, i: usize) -> Option<&Port>;
    /// Port `i`, mutable, if it exists.
    fn get_mut(&mut self, i: usize) -> Option<&mut Port>;
    /// Port `i`'s address (null: none), without forming a reference: how
    /// an engine reaches another port's [`Inbox`](super::Inbox) to write into it.
    #[inline(always)]
    fn raw(&mut self, i: usize) -> *mut Port {
        match self.get_mut(i) {
            Some(p) => p,
            None => core::ptr::null_mut(),
        }
    }
    /// Where this engine reaches the `len` bytes at `addr` of port `i`'s
    /// memory (an address as port `i`'s owner sees it, e.g. inside one of
    /// its regions); `None` when that memory is not mapped here. Ports of
    /// this engine's address space: `addr` itself.
    #[inline(always)]
    fn reach(&self, i: usize, addr: u64, len: u64) -> Option<*mut u8> {
        let _ = (i, len);
        Some(addr as usize as *mut u8)
    }
    /// Whether port `i` lives in another process: its tables are reachable
    /// (they lie in its symmetric heap) but its rings are not, so nothing
    /// that consumes its receive queue or writes its CQs can run.
    #[inline(always)]
    fn foreign(&self, i: usize) -> bool {
        let _ = i;
        false
    }
}

impl Ports for [Port] {
    #[inline(always)]
    fn get(&self, i: usize) -> Option<&Port> {
        <[Port]>::get(self, i)
    }
    #[inline(always)]
    fn get_mut(&mut self, i: usize) -> Option<&mut Port> {
        <[Port]>::get_mut(self, i)
    }
}

/// How an engine reaches a port of another process: the memory of it that
/// the engine's process has mapped — its symmetric heap, where its tables
/// and its remotely accessible regions lie — as the owner addresses it
/// (`from`, `len` bytes) and as this process does (`to`). `len == 0`: the
/// port shares the engine's address space and its addresses are used as
/// they are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// First byte, in the owner's address space.
    pub from: u64,
    /// Bytes (0: the same address space, no translation).
    pub len: u64,
    /// First byte, in this engine's address space.
    pub to: u64,
}

impl Window {
    /// The same address space.
    pub const SAME: Window = Window { from: 0, len: 0, to: 0 };

    /// `addr..addr + len` of the owner's memory, here (see [`Ports::reach`]).
    #[inline(always)]
    pub fn reach(&self, addr: u64, len: u64) -> Option<*mut u8> {
        if self.len == 0 {
            return Some(addr as usize as *mut u8);
        }
        let off = addr.wrapping_sub(self.from);
        if addr < self.from || off > self.len || len > self.len - off {
            return None;
        }
        Some((self.to + off) as usize as *mut u8)
    }
}

/// Ports in separate allocations: `ports[i]` points at port `i` (null: no
/// such port), and `windows[i]` says how its memory is reached (a port of
/// another process: through the mapping of its heap). `#[repr(C)]`,
/// 2056 bytes: it lives in device memory next to the engine's control block.
///
/// Concurrency: each port's engine writes its own port; another port's
/// engine reads it (the responder's regions, QP state, receive queue) and
/// writes only the [`Inbox`](super::Inbox) of the responder QP it is connected to: a
/// consumed receive WQE (SEND, WRITE with immediate) and a responder
/// error (IB responder class C) are events there, which the owner's
/// engine drains and applies itself — its receive CQEs, receive-queue
/// index, QP state, counters and error log (see [`super`]).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PortTable {
    /// Port `i`'s tables.
    pub ports: [*mut Port; MAX_PORTS],
    /// Ports in use (`ports[count..]` are null).
    pub count: u32,
    /// Zero.
    pub reserved: u32,
    /// How port `i`'s memory is reached ([`Window::SAME`]: directly).
    pub windows: [Window; MAX_PORTS],
}

const _: () = assert!(core::mem::size_of::<PortTable>() == 8 * MAX_PORTS + 8 + 24 * MAX_PORTS);

impl PortTable {
    /// No ports.
    pub const EMPTY: PortTable = PortTable {
        ports: [core::ptr::null_mut(); MAX_PORTS],
        count: 0,
        reserved: 0,
        windows: [Window::SAME; MAX_PORTS],
    };

    /// Port `i`'s window ([`Window::SAME`] past the table).
    #[inline(always)]
    pub fn window(&self, i: usize) -> Window {
        match self.windows.get(i) {
            Some(w) if i < self.count as usize => *w,
            _ => Window::SAME,
        }
    }

    /// Port `i`'s address (null past the table or for no such port).
    #[inline(always)]
    pub fn port_ptr(&self, i: usize) -> *mut Port {
        match self.ports.get(i) {
            Some(&p) if i < self.count as usize => p,
            _ => core::ptr::null_mut(),
        }
    }
}

impl Ports for PortTable {
    #[inline(always)]
    fn get(&self, i: usize) -> Option<&Port> {
        // SAFETY: whoever fills the table points every entry below `count`
        // at a live port (the engine's contract, `engine::resident`).
        unsafe { self.port_ptr(i).as_ref() }
    }
    #[inline(always)]
    fn get_mut(&mut self, i: usize) -> Option<&mut Port> {
        // SAFETY: as above.
        unsafe { self.port_ptr(i).as_mut() }
    }
    #[inline(always)]
    fn raw(&mut self, i: usize) -> *mut Port {
        self.port_ptr(i)
    }
    #[inline(always)]
    fn reach(&self, i: usize, addr: u64, len: u64) -> Option<*mut u8> {
        self.window(i).reach(addr, len)
    }
    #[inline(always)]
    fn foreign(&self, i: usize) -> bool {
        self.window(i).len != 0
    }
}
