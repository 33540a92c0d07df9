//! Proc-macros for doorbell.
//!
//! * [`macro@kernel`] turns one Rust function into a GPU kernel entry point
//!   (`extern "ptx-kernel"` on nvptx64) and, on the host, into a function the
//!   CPU emulator runs plus a marker type the launcher uses to type-check
//!   arguments.
//!
//! Each macro is split into `parse` → `validate` → `generate`; errors point at
//! the offending token, several are reported at once, and the original item is
//! emitted next to `compile_error!` so later diagnostics stay useful.

use proc_macro::TokenStream;

mod kernel;

/// Declares a kernel.
///
/// ```ignore
/// #[doorbell_kernels::kernel]
/// pub unsafe fn scale(x: *mut f32, a: f32, n: u32) { /* ... */ }
///
/// #[doorbell_kernels::kernel(hot)] // ptxas must report no local-memory spills
/// pub unsafe fn inner_loop(/* ... */) {}
/// ```
///
/// On `nvptx64` this emits `#[no_mangle] pub unsafe extern "ptx-kernel" fn`.
/// On the host it emits the same function (for the CPU emulator) and a
/// zero-sized type of the same name implementing
/// `doorbell_kernels::Kernel`, whose `Args` is the tuple of parameter types.
///
/// Rules (checked, with errors on the offending token): the function is
/// `unsafe` (kernels dereference raw device pointers), has no generics, no
/// `self`, no return type, plain identifier parameters, is not `async`/`const`
/// and has no explicit ABI. Options: `hot`.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    kernel::expand(attr.into(), item.into()).into()
}
