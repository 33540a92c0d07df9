//! Kernel families: one launch call whatever the transport.
//!
//! `#[kernel(transports(P2p, Ibgda))] fn k<T: Transport>(t: T, a: A, b: B)`
//! exports one entry per transport (`k_p2p`, `k_ibgda`). A [`Family`]
//! holds all of them, loaded once by [`Module::family`](crate::Module::family);
//! [`Stream::launch_family`](crate::Stream::launch_family) takes a transport
//! handle and the other arguments as a tuple, and the handle picks the
//! entry:
//!
//! - a concrete handle ([`P2p`], [`Ibgda`], [`Routed`]) picks it at compile
//!   time: a family not exported for that transport does not compile;
//! - an [`AnyTransport`] (a handle chosen at run time, e.g. from
//!   [`Communicator::transport`](crate::comm::Communicator::transport))
//!   picks it at launch: a family not exported for that transport returns
//!   [`Error::TransportNotExported`](crate::Error::TransportNotExported).

use std::any::{Any, TypeId};
use std::marker::PhantomData;

use doorbell_kernels::transport::{Ibgda, P2p, Proxy, Routed};
use doorbell_kernels::{AnyFamily, EntryVisitor, ForTransport, KernelFamily};

use crate::backend::FunctionBackend;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::FunctionAttributes;

/// The device transport a collective's kernel runs over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TransportKind {
    /// Loads and stores into peers' memory ([`Communicator::p2p`](crate::comm::Communicator::p2p)).
    #[default]
    P2p,
    /// Every peer through the (soft) NIC ([`Communicator::ibgda`](crate::comm::Communicator::ibgda)). No
    /// peer pointers: the pipelined algorithm.
    Ibgda,
    /// Per peer: load/store, or the NIC for the pairs
    /// [`AllReduceOptions::rdma_peers`](crate::coll::AllReduceOptions::rdma_peers) (default `DOORBELL_RDMA_PEERS`)
    /// names ([`Communicator::routed_with`](crate::comm::Communicator::routed_with)); the pipelined algorithm as
    /// soon as any pair goes through the NIC.
    Routed,
    /// Every peer through the NIC, each put, get and signal handed to a
    /// host thread that posts the WQEs ([`Communicator::proxy`](crate::comm::Communicator::proxy)): the
    /// CPU-proxy baseline to IBGDA. No peer pointers: the pipelined
    /// algorithm.
    Proxy,
}

impl TransportKind {
    /// The name users type.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::P2p => "p2p",
            TransportKind::Ibgda => "ibgda",
            TransportKind::Routed => "routed",
            TransportKind::Proxy => "proxy",
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TransportKind {
    type Err = Error;

    /// `p2p`, `ibgda`, `routed` or `proxy` (any case, surrounding blanks ignored);
    /// anything else is [`Error::BadTransport`].
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "p2p" => Ok(TransportKind::P2p),
            "ibgda" => Ok(TransportKind::Ibgda),
            "routed" => Ok(TransportKind::Routed),
            "proxy" => Ok(TransportKind::Proxy),
            _ => Err(Error::BadTransport(s.to_string())),
        }
    }
}

/// A transport handle whose type is chosen at run time: the argument that
/// lets one [`Stream::launch_family`](crate::Stream::launch_family) call
/// serve every transport a [`TransportKind`] flag may name.
#[derive(Clone, Copy, Debug)]
// The handles are kernel arguments, passed by value to every launch; the
// enum is never stored in bulk.
#[allow(clippy::large_enum_variant)]
pub enum AnyTransport {
    /// Loads and stores into peers' memory.
    P2p(P2p),
    /// Every peer through the (soft) NIC.
    Ibgda(Ibgda),
    /// Load/store or the NIC, per peer.
    Routed(Routed),
    /// Every peer through the NIC, posted by a host thread.
    Proxy(Proxy),
}

impl AnyTransport {
    /// Which transport the handle is.
    pub fn kind(&self) -> TransportKind {
        match self {
            AnyTransport::P2p(_) => TransportKind::P2p,
            AnyTransport::Ibgda(_) => TransportKind::Ibgda,
            AnyTransport::Routed(_) => TransportKind::Routed,
            AnyTransport::Proxy(_) => TransportKind::Proxy,
        }
    }

    /// The handle itself, as `Any` (its concrete type picks a family's entry).
    fn as_any(&self) -> &dyn Any {
        match self {
            AnyTransport::P2p(t) => t,
            AnyTransport::Ibgda(t) => t,
            AnyTransport::Routed(t) => t,
            AnyTransport::Proxy(t) => t,
        }
    }
}

impl From<P2p> for AnyTransport {
    fn from(t: P2p) -> Self {
        AnyTransport::P2p(t)
    }
}

impl From<Ibgda> for AnyTransport {
    fn from(t: Ibgda) -> Self {
        AnyTransport::Ibgda(t)
    }
}

impl From<Routed> for AnyTransport {
    fn from(t: Routed) -> Self {
        AnyTransport::Routed(t)
    }
}

impl From<Proxy> for AnyTransport {
    fn from(t: Proxy) -> Self {
        AnyTransport::Proxy(t)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::P2p {}
    impl Sealed for super::Ibgda {}
    impl Sealed for super::Routed {}
    impl Sealed for super::Proxy {}
    impl Sealed for super::AnyTransport {}
}

/// A transport handle [`Stream::launch_family`](crate::Stream::launch_family)
/// accepts for family `F`: [`P2p`], [`Ibgda`] or [`Routed`] when `F` is
/// exported for it (checked at compile time), or [`AnyTransport`] when `F`
/// implements [`AnyFamily`] (its other parameters do not depend on the
/// transport; checked at launch). Sealed: implemented for those four types
/// only.
pub trait FamilyHandle<F: KernelFamily>: Copy + sealed::Sealed {
    /// The family's parameters after the transport handle, as a tuple.
    type Rest: Copy + 'static;

    /// The transport's name, as errors print it.
    fn transport_name(&self) -> &'static str;

    /// Calls `visitor` with the entry of `F` for this handle and its full
    /// argument tuple; `None` when `F` has no entry for it.
    #[doc(hidden)]
    fn visit_entry<V: EntryVisitor>(self, rest: Self::Rest, visitor: V) -> Option<V::Output>;

    /// The concrete handle type (to find the entry among the family's).
    #[doc(hidden)]
    fn handle_type(&self) -> TypeId;
}

macro_rules! concrete_handle {
    ($($t:ident => $name:literal),*) => { $(
        impl<F: KernelFamily + ForTransport<$t>> FamilyHandle<F> for $t {
            type Rest = <F as ForTransport<$t>>::Rest;

            fn transport_name(&self) -> &'static str {
                $name
            }

            fn visit_entry<V: EntryVisitor>(self, rest: Self::Rest, visitor: V) -> Option<V::Output> {
                Some(visitor.visit::<<F as ForTransport<$t>>::Kernel>(F::args(self, rest)))
            }

            fn handle_type(&self) -> TypeId {
                TypeId::of::<$t>()
            }
        }
    )* };
}
concrete_handle!(P2p => "p2p", Ibgda => "ibgda", Routed => "routed", Proxy => "proxy");

impl<F: AnyFamily> FamilyHandle<F> for AnyTransport {
    type Rest = <F as AnyFamily>::Rest;

    fn transport_name(&self) -> &'static str {
        self.kind().name()
    }

    fn visit_entry<V: EntryVisitor>(self, rest: Self::Rest, visitor: V) -> Option<V::Output> {
        F::visit_entry(self.as_any(), rest, visitor)
    }

    fn handle_type(&self) -> TypeId {
        self.as_any().type_id()
    }
}

/// Every entry of kernel family `F`, loaded from a module once (see
/// [`Module::family`](crate::Module::family)); launch it with
/// [`Stream::launch_family`](crate::Stream::launch_family).
pub struct Family<F: KernelFamily> {
    device: Device,
    /// Parallel to `F::ENTRIES`.
    entries: Vec<FunctionBackend>,
    _f: PhantomData<fn() -> F>,
}

impl<F: KernelFamily> Family<F> {
    /// Loads every entry of `F` (`load` gives one by its PTX name).
    pub(crate) fn load(device: Device, mut load: impl FnMut(&'static str) -> Result<FunctionBackend>) -> Result<Self> {
        let entries = F::ENTRIES.iter().map(|e| load(e.entry)).collect::<Result<Vec<_>>>()?;
        Ok(Family {
            device,
            entries,
            _f: PhantomData,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The family's name.
    pub fn name(&self) -> &'static str {
        F::NAME
    }

    /// The transports the family is exported for, as
    /// `#[kernel(transports(...))]` lists them.
    pub fn transports(&self) -> impl Iterator<Item = &'static str> {
        F::ENTRIES.iter().map(|e| e.transport)
    }

    /// Whether the family has an entry for `handle`'s transport (always
    /// true for a concrete handle that compiles).
    pub fn exports<H: FamilyHandle<F>>(&self, handle: &H) -> bool {
        self.index_of(handle).is_some()
    }

    /// Registers, local memory and max threads per block of the entry that
    /// `handle` launches, as the driver reports them (`Ok(None)` on the
    /// emulator); [`Error::TransportNotExported`] when the family has no
    /// entry for it.
    pub fn attributes<H: FamilyHandle<F>>(&self, handle: &H) -> Result<Option<FunctionAttributes>> {
        match self.index_of(handle) {
            Some(i) => Ok(self.entries[i].attributes()),
            None => Err(self.not_exported(handle.transport_name())),
        }
    }

    fn index_of<H: FamilyHandle<F>>(&self, handle: &H) -> Option<usize> {
        let ty = handle.handle_type();
        F::ENTRIES.iter().position(|e| (e.transport_type)() == ty)
    }

    /// The loaded entry named `name` (a `K::NAME` of one of the family's
    /// entries).
    pub(crate) fn entry(&self, name: &'static str) -> Result<&FunctionBackend> {
        F::ENTRIES
            .iter()
            .position(|e| e.entry == name)
            .map(|i| &self.entries[i])
            .ok_or(Error::KernelNotFound { name })
    }

    /// The error for a launch with a transport the family lacks.
    pub(crate) fn not_exported(&self, transport: &'static str) -> Error {
        Error::TransportNotExported {
            family: F::NAME,
            transport,
            exported: self.transports().collect::<Vec<_>>().join(", "),
        }
    }
}
