//! What a module is loaded from: PTX text, or a kernel crate's build
//! output (its PTX and cubin) embedded with [`module_image!`](crate::module_image).
//!
//! Plain data with no device behind it, so the backends that load modules
//! and the public [`Module`](crate::Module) both build on it.
//!
//! ## Two images of one crate
//! A build with `DOORBELL_TRACE_KERNELS=1` ([`crate::build`]) builds each
//! kernel crate twice: the default image and one with the device trace's
//! hooks ([`crate::trace`]), and [`module_image!`](crate::module_image)
//! embeds both. A load on a GPU takes the traced image only when tracing
//! is requested for this process ([`tracing_requested`]: `DOORBELL_TRACE`
//! set, or a [`Communicator::trace_start`](crate::comm::Communicator::trace_start)
//! or a communicator made with [`CommOptions::trace`](crate::comm::CommOptions::trace)
//! before the load); otherwise it loads the default image, the very code of
//! a build without the hooks (the hooks cost even when they test a word
//! that says "off": see `doorbell_kernels::trace`). A module loaded with
//! its default image while it had a traced one stays untraced: tracing
//! started later warns naming it ([`loaded_without_hooks`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A kernel crate's build output as a binary embeds it: its PTX and the
/// cubin `ptxas` made of it for the build's arch (empty when the build
/// found no `ptxas`; see [`crate::build`]), and, from a build with
/// `DOORBELL_TRACE_KERNELS=1`, the same two of the crate built with the
/// device trace's hooks (module docs). Loading one on a GPU of that arch
/// skips the driver's compile of the PTX (seconds per MB of PTX, the
/// first time on a machine); on another GPU, or with `DOORBELL_LOAD_CUBIN=0`,
/// the PTX is loaded. Make one with [`module_image!`](crate::module_image)
/// or [`ModuleImage::new`].
#[derive(Clone, Copy, Debug)]
pub struct ModuleImage {
    /// The PTX text.
    pub ptx: &'static str,
    /// The cubin (may be empty).
    pub cubin: &'static [u8],
    /// The kernel crate's name (underscored), for messages; may be empty.
    pub name: &'static str,
    /// The PTX of the crate built with the device trace's hooks; empty
    /// when the build made none (no `DOORBELL_TRACE_KERNELS=1`).
    pub traced_ptx: &'static str,
    /// The cubin of [`ModuleImage::traced_ptx`] (may be empty).
    pub traced_cubin: &'static [u8],
}

/// Which of a [`ModuleSource`]'s images a load uses ([`ModuleSource::select`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageChoice {
    /// The only image there is (PTX text, or an image built without a
    /// traced twin).
    Only,
    /// The default image, although a traced one was built (tracing was
    /// not requested).
    Default,
    /// The image with the trace's hooks (tracing requested).
    Traced,
}

/// The PTX and cubin a load uses, and which image they are.
#[derive(Clone, Copy, Debug)]
pub struct SelectedImage<'a> {
    /// The PTX text.
    pub ptx: &'a str,
    /// The cubin (may be empty).
    pub cubin: &'a [u8],
    /// Which image.
    pub choice: ImageChoice,
}

impl ModuleImage {
    /// An image of one build (no traced twin): PTX and cubin, named `name`.
    pub const fn new(name: &'static str, ptx: &'static str, cubin: &'static [u8]) -> ModuleImage {
        ModuleImage {
            ptx,
            cubin,
            name,
            traced_ptx: "",
            traced_cubin: &[],
        }
    }

    /// Whether the build made a traced image of this crate too.
    pub const fn has_traced(&self) -> bool {
        !self.traced_ptx.is_empty()
    }
}

/// The [`ModuleImage`] of kernel crate `name` built by
/// [`PtxBuilder`](crate::build::PtxBuilder) into `OUT_DIR` (its PTX and
/// cubin embedded, and those of its traced build when there is one):
/// `doorbell::module_image!("my_kernels")`.
#[macro_export]
macro_rules! module_image {
    ($name:literal) => {
        $crate::ModuleImage {
            ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".ptx")),
            cubin: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".cubin")),
            name: $name,
            traced_ptx: include_str!(concat!(env!("OUT_DIR"), "/", $name, ".traced.ptx")),
            traced_cubin: include_bytes!(concat!(env!("OUT_DIR"), "/", $name, ".traced.cubin")),
        }
    };
}

/// What [`Device::load_module`](crate::Device::load_module) loads: PTX text, or a [`ModuleImage`].
#[derive(Clone, Copy, Debug)]
pub enum ModuleSource<'a> {
    /// PTX text (compiled by the driver at load).
    Ptx(&'a str),
    /// PTX and, where it matches the GPU, its cubin.
    Image(&'a ModuleImage),
}

impl<'a> From<&'a str> for ModuleSource<'a> {
    fn from(ptx: &'a str) -> Self {
        ModuleSource::Ptx(ptx)
    }
}

impl<'a> From<&'a ModuleImage> for ModuleSource<'a> {
    fn from(image: &'a ModuleImage) -> Self {
        ModuleSource::Image(image)
    }
}

impl<'a> ModuleSource<'a> {
    /// The image a load on a GPU uses when tracing is (`tracing`) or is
    /// not requested: the traced one only when there is one and tracing
    /// is requested; with tracing off always the default one.
    pub fn select(&self, tracing: bool) -> SelectedImage<'a> {
        match *self {
            ModuleSource::Ptx(ptx) => SelectedImage {
                ptx,
                cubin: &[],
                choice: ImageChoice::Only,
            },
            ModuleSource::Image(m) if !m.has_traced() => SelectedImage {
                ptx: m.ptx,
                cubin: m.cubin,
                choice: ImageChoice::Only,
            },
            ModuleSource::Image(m) if tracing => SelectedImage {
                ptx: m.traced_ptx,
                cubin: m.traced_cubin,
                choice: ImageChoice::Traced,
            },
            ModuleSource::Image(m) => SelectedImage {
                ptx: m.ptx,
                cubin: m.cubin,
                choice: ImageChoice::Default,
            },
        }
    }

    /// The module's name for messages: the image's, else "PTX text".
    pub fn name(&self) -> &'a str {
        match *self {
            ModuleSource::Image(m) if !m.name.is_empty() => m.name,
            _ => "PTX text",
        }
    }
}

/// Set once tracing was started in this process.
static TRACE_REQUESTED: AtomicBool = AtomicBool::new(false);
/// Modules loaded with their default image while they had a traced one.
static LOADED_WITHOUT_HOOKS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// `DOORBELL_TRACE`: the directory of the trace (unset or empty: off).
/// Defined here, where a load decides on the traced image; the trace
/// module re-exports it.
pub const TRACE_ENV: &str = "DOORBELL_TRACE";

/// Marks tracing as requested for this process: later loads take the
/// traced images. Never cleared (a trace that ended leaves the traced
/// images to later loads: they cost a little, but a later trace records).
pub(crate) fn request_tracing() {
    TRACE_REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a module loaded now takes its traced image: `DOORBELL_TRACE`
/// is set (not empty), or tracing was started in this process
/// ([`Communicator::trace_start`](crate::comm::Communicator::trace_start),
/// [`CommOptions::trace`](crate::comm::CommOptions::trace)).
pub fn tracing_requested() -> bool {
    TRACE_REQUESTED.load(Ordering::SeqCst) || std::env::var_os(TRACE_ENV).is_some_and(|v| !v.is_empty())
}

/// What a load on a GPU uses of `src` with tracing requested or not
/// (`tracing`): [`ModuleSource::select`], and a module that takes its
/// default image while it has a traced one is noted for
/// [`loaded_without_hooks`].
pub(crate) fn select_for_load<'a>(src: &ModuleSource<'a>, tracing: bool) -> SelectedImage<'a> {
    let s = src.select(tracing);
    let name = src.name().to_string();
    let mut v = LOADED_WITHOUT_HOOKS.lock().unwrap_or_else(|p| p.into_inner());
    match s.choice {
        ImageChoice::Default if !v.contains(&name) => v.push(name),
        // Loaded again with its hooks: this load records.
        ImageChoice::Traced => v.retain(|n| *n != name),
        _ => {}
    }
    s
}

/// The modules this process loaded on a GPU with their default image
/// while a traced image had been built (tracing was not yet requested):
/// their kernels record nothing when tracing starts later. Load them after
/// tracing starts (or set `DOORBELL_TRACE`) to trace them.
pub fn loaded_without_hooks() -> Vec<String> {
    LOADED_WITHOUT_HOOKS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The warning for tracing started by rank `rank` after `untraced` (from
/// [`loaded_without_hooks`]) were loaded without their hooks; `None` when
/// there are none.
pub(crate) fn late_start_warning(rank: usize, untraced: &[String]) -> Option<String> {
    if untraced.is_empty() {
        return None;
    }
    Some(format!(
        "rank {rank}: tracing started after module(s) {} were loaded on the GPU with their default image (tracing was \
         off then): their kernels record nothing in this trace. Load them after trace_start, or set DOORBELL_TRACE \
         before the process loads them, to trace them",
        untraced.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: ModuleImage = ModuleImage {
        ptx: "default",
        cubin: b"d",
        name: "image_test_two",
        traced_ptx: "traced",
        traced_cubin: b"t",
    };

    #[test]
    fn the_traced_image_is_taken_only_when_tracing_is_requested() {
        let src = ModuleSource::from(&TWO);
        let off = src.select(false);
        assert_eq!((off.ptx, off.cubin, off.choice), ("default", &b"d"[..], ImageChoice::Default));
        let on = src.select(true);
        assert_eq!((on.ptx, on.cubin, on.choice), ("traced", &b"t"[..], ImageChoice::Traced));
        // One build only: that image, whatever tracing is.
        let one = ModuleImage::new("one", "only", b"o");
        for t in [false, true] {
            let s = ModuleSource::from(&one).select(t);
            assert_eq!((s.ptx, s.choice), ("only", ImageChoice::Only));
            assert_eq!(ModuleSource::from("text").select(t).choice, ImageChoice::Only);
        }
    }

    #[test]
    fn a_module_loaded_untraced_is_named_when_tracing_starts_later() {
        const LATE: ModuleImage = ModuleImage {
            name: "image_test_late",
            ..TWO
        };
        let src = ModuleSource::from(&LATE);
        assert!(!loaded_without_hooks().contains(&"image_test_late".to_string()));
        assert_eq!(select_for_load(&src, false).choice, ImageChoice::Default);
        assert!(loaded_without_hooks().contains(&"image_test_late".to_string()));
        let w = late_start_warning(3, &loaded_without_hooks()).expect("a warning");
        assert!(
            w.starts_with("rank 3: tracing started after module(s) ") && w.contains("image_test_late"),
            "{w}"
        );
        // Loaded again with tracing requested: the traced image, not named any more.
        assert_eq!(select_for_load(&src, true).choice, ImageChoice::Traced);
        assert!(!loaded_without_hooks().contains(&"image_test_late".to_string()));
        assert_eq!(late_start_warning(0, &[]), None);
    }
}
