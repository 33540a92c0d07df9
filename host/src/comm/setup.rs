//! The phases of [`Communicator::new`](super::Communicator::new), in order:
//! who is where ([`locate`]), the heap and how peers reach it
//! ([`allocate_heap`]), every peer's heap mapped ([`map_peers`]). Each is
//! collective where it exchanges anything over the world.

use std::path::PathBuf;

use super::fdpass::{self, FdServer};
use super::shm::{self, ShmRegion};
use crate::backend::{IpcMapping, VmmRange, IPC_HANDLE_BYTES};
use crate::device::{Backend, Device};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::world::World;

/// How this rank reaches a peer's heap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerRoute {
    /// This rank itself.
    Local,
    /// Same process, same device address space.
    SameProcess,
    /// Same process, another GPU, through CUDA peer access.
    PeerAccess,
    /// Another process on this host, through CUDA's inter-process sharing:
    /// the heap's virtual-memory parts handed over as file descriptors, or
    /// a legacy CUDA IPC handle ([`super::Communicator::peer_mapping`]).
    CudaIpc,
    /// Another process on this host, through shared memory (emulator).
    SharedMemory,
    /// Another host: no load/store path, only the NIC reaches it (IBGDA
    /// over a ConnectX, or the NIC half of the routed transport).
    Remote,
}

/// How this process maps the heap allocation of a peer that runs in
/// another process of this host ([`Communicator::peer_mapping`](super::Communicator::peer_mapping)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerMapping {
    /// The allocation's address here (the peer's heap starts there).
    pub base: u64,
    /// Bytes from `base` this process may write: the peer's heap and its
    /// soft NIC tables' inboxes.
    pub writable: u64,
    /// Bytes after those this process may only read: the rest of the
    /// peer's soft NIC port tables (its engine's alone to write). 0 where
    /// the device maps the whole allocation read-write (legacy CUDA IPC,
    /// on a GPU that cannot export allocations as file descriptors).
    pub read_only: u64,
}

/// Where a peer runs, seen from a rank: all [`route_to`] needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerPlace {
    /// The peer runs on another host.
    pub remote: bool,
    /// The peer is a thread of this rank's process.
    pub same_process: bool,
    /// The ranks run on GPUs (not the CPU emulator).
    pub gpu: bool,
    /// The peer runs on this rank's GPU (same ordinal).
    pub same_gpu: bool,
}

/// The route rank `rank` takes to `peer` placed as `place`: the decision
/// [`Communicator::new`](super::Communicator::new) makes, without a device.
/// Whether the driver then grants it (peer access, CUDA IPC) is checked
/// there; `doorbell doctor` checks it from the peer-access matrix.
pub fn route_to(rank: usize, peer: usize, place: PeerPlace) -> PeerRoute {
    if peer == rank {
        PeerRoute::Local
    } else if place.remote {
        PeerRoute::Remote
    } else if place.same_process {
        if place.gpu && !place.same_gpu {
            PeerRoute::PeerAccess
        } else {
            PeerRoute::SameProcess
        }
    } else if place.gpu {
        PeerRoute::CudaIpc
    } else {
        PeerRoute::SharedMemory
    }
}

/// Where the soft NIC's table tail ([`crate::nic::soft::TABLES_TAIL`] bytes) starts in
/// a heap allocation of a world of several processes: past the heap, where
/// the tables' inboxes (which peers write) end on a multiple of
/// [`TAIL_ALIGN`], so that peers can map the rest of the tables read-only
/// (by whole pages on the emulator, by a separate allocation on a GPU).
pub(super) fn tail_off(heap_len: u64) -> u64 {
    (heap_len + PEER_WRITABLE).next_multiple_of(TAIL_ALIGN) - PEER_WRITABLE
}

/// The alignment of the part of a shared heap allocation that peers map
/// read-only: the GPU's allocation granularity.
pub(super) const TAIL_ALIGN: u64 = crate::backend::VMM_ALIGN;

const PEER_WRITABLE: u64 = doorbell_softnic::engine::tables::PEER_WRITABLE_BYTES as u64;
const _: () = assert!(TAIL_ALIGN.is_multiple_of(doorbell_softnic::engine::tables::PAGE as u64) && PEER_WRITABLE.is_multiple_of(4096));

/// The two parts of a heap allocation of a world of several processes, in
/// bytes, each a multiple of [`TAIL_ALIGN`]: the heap and the soft NIC
/// tables' inboxes (peers map them read-write), then the rest of the
/// tables (peers map it read-only).
pub(super) fn heap_parts(heap_len: u64) -> [u64; 2] {
    let writable = tail_off(heap_len) + PEER_WRITABLE;
    let end = (tail_off(heap_len) + crate::nic::soft::TABLES_TAIL).next_multiple_of(TAIL_ALIGN);
    [writable, end - writable]
}

/// `DOORBELL_HEAP_PARTS`: `0` makes a GPU rank share its heap with the
/// other processes of its host through legacy CUDA IPC (read-write as a
/// whole, the soft NIC tables included) instead of parts handed over a
/// Unix socket: for ranks that cannot reach each other's abstract sockets
/// (other network namespaces). `1` (the default): parts where they can be
/// used.
pub const HEAP_PARTS_ENV: &str = "DOORBELL_HEAP_PARTS";

/// How long a rank hands its heap's parts to the processes that map them
/// (the set-up's barrier after mapping ends it sooner).
const HAND_OVER_FOR: std::time::Duration = std::time::Duration::from_secs(300);

/// A GPU heap handle's kind, after its 8-byte address: legacy CUDA IPC (the
/// 64-byte handle follows; peers map the whole allocation read-write) or
/// parts handed over a Unix socket (its secret and name follow;
/// [`heap_parts`]).
const HANDLE_IPC: u8 = 0;
const HANDLE_PARTS: u8 = 1;

pub(super) enum Heap {
    Device(DeviceBuffer<u8>),
    Shm(ShmRegion),
    /// A GPU heap of several processes, in parts ([`heap_parts`]).
    Parts(VmmRange),
}

/// A peer's heap mapped into this rank; unmapped on drop.
pub(super) enum Mapping {
    Ipc(#[allow(dead_code)] IpcMapping),
    Shm(#[allow(dead_code)] ShmRegion),
    Parts(#[allow(dead_code)] VmmRange),
}

/// Which device a rank runs on (phase 1). Where it runs (host, process)
/// the world already knows: [`World::peers`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct DeviceId {
    pub(super) ordinal: u32,
    /// The GPU's UUID (hex), or "cpu".
    pub(super) uuid: String,
}

impl DeviceId {
    fn of(device: &Device) -> DeviceId {
        DeviceId {
            ordinal: device.ordinal() as u32,
            uuid: device.inner.uuid(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}", self.ordinal, self.uuid).into_bytes()
    }

    fn decode(b: &[u8], rank: usize) -> Result<DeviceId> {
        let s = String::from_utf8_lossy(b);
        let (ordinal, uuid) = s
            .split_once('\n')
            .ok_or_else(|| Error::comm(format!("rank {rank} sent a malformed device id")))?;
        let ordinal = ordinal
            .parse()
            .map_err(|_| Error::comm(format!("rank {rank}: bad device ordinal {ordinal:?}")))?;
        Ok(DeviceId {
            ordinal,
            uuid: uuid.to_string(),
        })
    }
}

/// Where every rank is, as this rank learnt it.
pub(super) struct Located {
    /// This rank's device.
    pub me: DeviceId,
    /// Every rank's device, in rank order.
    pub ids: Vec<DeviceId>,
    /// Ranks on another host (reached only through the NIC).
    pub remote: Vec<bool>,
    /// Ranks that proved to run in this process.
    pub same_process: Vec<bool>,
    /// Some rank runs in another process.
    pub multi_process: bool,
    /// This rank's heap file (the emulator's shared memory), if any.
    pub my_file: Option<PathBuf>,
    /// Every rank's heap file of this host, removed when this drops.
    pub heap_files: shm::HeapFiles,
    /// Each peer's heap file, where it is another process of this host.
    pub peer_files: Vec<Option<PathBuf>>,
}

/// Who is where (the devices) and who shares this process, proved by a tag
/// only this process can make (a pid proves nothing: any peer can claim
/// ours); on the emulator also the heap file names, published before any
/// file exists, so that every rank removes every file of the job however
/// the set-up ends. Collective.
pub(super) fn locate(world: &World, device: &Device) -> Result<Located> {
    let (rank, size) = (world.rank(), world.world_size());
    let peers = world.peers();
    let (my_pid, my_host) = (peers[rank].pid, peers[rank].hostname.clone());
    let remote: Vec<bool> = peers.iter().map(|info| info.hostname != my_host).collect();
    let me = DeviceId::of(device);
    let ids = world
        .all_gather_bytes(&me.encode())?
        .iter()
        .enumerate()
        .map(|(r, b)| DeviceId::decode(b, r))
        .collect::<Result<Vec<_>>>()?;

    let my_file = if device.is_gpu() { None } else { Some(shm::new_heap_path()?) };
    let mut intro = world.process_tag()?.to_vec();
    if let Some(f) = &my_file {
        intro.extend_from_slice(f.to_string_lossy().as_bytes());
    }
    let intros = world.all_gather_bytes(&intro)?;
    let mut same_process = vec![true; size];
    for p in (0..size).filter(|&p| p != rank) {
        same_process[p] = world.proves_same_process(p, intros[p].get(..32).unwrap_or_default())?;
        if !same_process[p] && !remote[p] && peers[p].pid == my_pid {
            return Err(Error::PeerUnreachable {
                rank,
                peer: p,
                reason: format!(
                    "it claims this process's pid {my_pid} but cannot prove that it runs in this process; \
                     it is another process (in another pid namespace?) or it lies about its pid"
                ),
            });
        }
    }
    let multi_process = same_process.contains(&false);
    let mut heap_files = shm::HeapFiles::default();
    let mut peer_files = vec![None; size];
    if let (Some(f), true) = (&my_file, multi_process) {
        heap_files.add(f.clone());
        for p in (0..size).filter(|&p| !same_process[p] && !remote[p]) {
            let path = shm::check_heap_path(intros[p].get(32..).unwrap_or_default(), rank, p)?;
            heap_files.add(path.clone());
            peer_files[p] = Some(path);
        }
    }
    Ok(Located {
        me,
        ids,
        remote,
        same_process,
        multi_process,
        my_file,
        heap_files,
        peer_files,
    })
}

/// Allocates this rank's heap and publishes how to reach it: the heap, its
/// base address, the bytes allocated, every rank's handle and, where peers
/// map its parts, the server that hands them over (to keep until every
/// rank has mapped). In a world of several processes the allocation
/// carries a tail past the heap for the soft NIC's port tables
/// (`ibgda.rs`): peers map it with the heap, the tables past their inboxes
/// read-only where the device allows ([`heap_parts`]), but no transport
/// call and no registered region reaches it. Collective.
pub(super) fn allocate_heap(world: &World, device: &Device, heap_len: u64, at: &Located) -> Result<Allocated> {
    let alloc_len = if at.multi_process {
        heap_parts(heap_len).iter().sum::<u64>() as usize
    } else {
        heap_len as usize
    };
    let mut server = None;
    // Every other process of this host maps the heap; ranks of this
    // process reach it by address (a virtual-memory heap is mapped for
    // this rank's GPU only, so they keep the plain allocation).
    let size = at.remote.len();
    let mappers = (0..size).filter(|&p| !at.same_process[p] && !at.remote[p]).count();
    let alone = (0..size).filter(|&p| at.same_process[p]).count() == 1;
    let parts_unusable = if mappers == 0 || !alone {
        Some("other ranks run in this process, or no other process of this host maps the heap".to_string())
    } else if device.is_gpu() && !crate::vars::flag(HEAP_PARTS_ENV, true)? {
        Some(format!("{HEAP_PARTS_ENV}=0"))
    } else {
        device.inner.vmm_unshareable()
    };
    let (heap, handle): (Heap, Vec<u8>) = match device.backend() {
        Backend::Gpu if at.multi_process => match parts_unusable {
            None => {
                let range = device.inner.vmm_alloc(&heap_parts(heap_len))?;
                let mut h = range.as_raw().to_le_bytes().to_vec();
                let s = FdServer::start(heap_parts(heap_len).to_vec(), range.export()?, mappers, HAND_OVER_FOR)?;
                h.push(HANDLE_PARTS);
                h.extend_from_slice(s.secret());
                h.extend_from_slice(s.name().as_bytes());
                server = Some(s);
                (Heap::Parts(range), h)
            }
            Some(why) => {
                if mappers > 0 {
                    tracing::warn!(
                        "rank {}: {why}: the other processes of this host map this heap through CUDA IPC, \
                         read-write as a whole (the soft NIC's port tables included)",
                        world.rank()
                    );
                }
                let buf = device.alloc_zeroed::<u8>(alloc_len)?;
                let mut h = buf.as_raw().to_le_bytes().to_vec();
                h.push(HANDLE_IPC);
                h.extend_from_slice(&device.inner.ipc_export(buf.as_raw())?);
                (Heap::Device(buf), h)
            }
        },
        Backend::Gpu => {
            let buf = device.alloc_zeroed::<u8>(alloc_len)?;
            let h = buf.as_raw().to_le_bytes().to_vec();
            (Heap::Device(buf), h)
        }
        Backend::Cpu | Backend::Auto => {
            if let (Some(path), true) = (&at.my_file, at.multi_process) {
                let region = ShmRegion::create(path, alloc_len)?;
                let h = (region.ptr as u64).to_le_bytes().to_vec();
                (Heap::Shm(region), h)
            } else {
                let buf = device.alloc_zeroed::<u8>(heap_len as usize)?;
                let h = buf.as_raw().to_le_bytes().to_vec();
                (Heap::Device(buf), h)
            }
        }
    };
    let heap_base = match &heap {
        Heap::Device(b) => b.as_raw(),
        Heap::Shm(r) => r.ptr as u64,
        Heap::Parts(r) => r.as_raw(),
    };
    let handles = world.all_gather_bytes(&handle)?;
    Ok(Allocated {
        heap,
        base: heap_base,
        alloc_len,
        handles,
        server,
    })
}

/// What [`allocate_heap`] made and learnt.
pub(super) struct Allocated {
    pub heap: Heap,
    /// The heap's address here.
    pub base: u64,
    /// Bytes allocated (the heap, and the tables' tail where several processes share it).
    pub alloc_len: usize,
    /// Every rank's handle to its heap.
    pub handles: Vec<Vec<u8>>,
    /// Hands this heap's parts to the processes that map them (kept until
    /// every rank has mapped).
    pub server: Option<FdServer>,
}

/// What [`map_peers`] mapped: per rank, the heap's base address here, the
/// route, and where another process of this host, how it is mapped; and
/// the mappings to keep.
pub(super) struct Mapped {
    pub bases: Vec<u64>,
    pub routes: Vec<PeerRoute>,
    pub mappings: Vec<Mapping>,
    pub layouts: Vec<Option<PeerMapping>>,
}

/// Maps every peer's heap: each rank's base address (this rank's own at
/// its index), its route, and the mappings to keep. Peers' addresses are
/// used only for ranks that proved to share this address space.
pub(super) fn map_peers(device: &Device, rank: usize, at: &Located, handles: &[Vec<u8>], heap: (u64, u64, usize)) -> Result<Mapped> {
    let (heap_base, heap_len, alloc_len) = heap;
    let parts = heap_parts(heap_len);
    let mut layouts = vec![None; handles.len()];
    let size = handles.len();
    let mut bases = vec![0u64; size];
    let mut routes = vec![PeerRoute::Local; size];
    let mut mappings = Vec::new();
    for p in 0..size {
        let place = PeerPlace {
            remote: at.remote[p],
            same_process: at.same_process[p],
            gpu: device.is_gpu(),
            same_gpu: at.ids[p].ordinal == at.me.ordinal,
        };
        let route = route_to(rank, p, place);
        match route {
            PeerRoute::Local => {
                bases[p] = heap_base;
                continue;
            }
            PeerRoute::Remote => {
                routes[p] = route;
                continue;
            }
            _ => {}
        }
        let h = &handles[p];
        if h.len() < 8 {
            return Err(Error::comm(format!("rank {p} sent a malformed heap handle")));
        }
        let addr = u64::from_le_bytes(h[..8].try_into().expect("8 bytes"));
        match route {
            PeerRoute::PeerAccess => {
                device.inner.enable_peer_access(at.ids[p].ordinal as usize, rank, p)?;
                bases[p] = addr;
            }
            PeerRoute::SameProcess => bases[p] = addr,
            PeerRoute::CudaIpc => {
                let who = (at.ids[p].ordinal, rank, p);
                let mapping = match h.get(8).copied() {
                    Some(HANDLE_PARTS) => {
                        let Some((secret, name)) = h[9..].split_first_chunk::<{ fdpass::SECRET_BYTES }>() else {
                            return Err(Error::comm(format!("rank {p} sent a malformed heap handle")));
                        };
                        let (words, fds) = fdpass::fetch(name, secret, (rank, p), HAND_OVER_FOR)?;
                        if words != parts {
                            return Err(Error::PeerUnreachable {
                                rank,
                                peer: p,
                                reason: format!(
                                    "it handed over heap parts of {words:?} bytes, not {parts:?}; every rank must run \
                                     this doorbell version with the same heap size"
                                ),
                            });
                        }
                        // Its tables past their inboxes: its engine's to write.
                        Mapping::Parts(device.inner.vmm_import(&fds, &parts, 1, who)?)
                    }
                    Some(HANDLE_IPC) => {
                        let Ok(ipc) = <&[u8; IPC_HANDLE_BYTES]>::try_from(&h[9..]) else {
                            return Err(Error::comm(format!("rank {p} sent a malformed CUDA IPC handle")));
                        };
                        // The mapping must span what this rank will touch: the heap
                        // and the tables tail (the peer's word for its size is not trusted).
                        Mapping::Ipc(device.inner.ipc_open(ipc, alloc_len as u64, who.0, rank, p)?)
                    }
                    _ => return Err(Error::comm(format!("rank {p} sent no heap handle for another process"))),
                };
                let (base, writable, read_only) = match &mapping {
                    Mapping::Parts(m) => (m.as_raw(), parts[0], parts[1]),
                    Mapping::Ipc(m) => (m.as_raw(), alloc_len as u64, 0),
                    Mapping::Shm(m) => (m.ptr as u64, parts[0], parts[1]),
                };
                bases[p] = base;
                layouts[p] = Some(PeerMapping { base, writable, read_only });
                mappings.push(mapping);
            }
            _ => {
                let Some(path) = at.peer_files[p].as_ref() else {
                    return Err(Error::comm(format!(
                        "rank {p} is another process of this host and published no heap file"
                    )));
                };
                let region = ShmRegion::open(path, alloc_len, rank, p)?;
                if at.multi_process {
                    // The peer's soft NIC tables past its inboxes are its own
                    // engine's to write: read-only here (a stray store faults
                    // instead of corrupting them).
                    region.read_only_from(parts[0] as usize, rank, p)?;
                }
                bases[p] = region.ptr as u64;
                layouts[p] = Some(PeerMapping {
                    base: bases[p],
                    writable: parts[0],
                    read_only: parts[1],
                });
                mappings.push(Mapping::Shm(region));
            }
        }
        routes[p] = route;
    }
    Ok(Mapped {
        bases,
        routes,
        mappings,
        layouts,
    })
}
