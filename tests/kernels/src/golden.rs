//! One kernel per memory-ordering primitive, generated from the same table
//! as the primitives (`doorbell_kernels::ordering_table!`): the PTX test
//! checks that `golden_<name>` emits exactly the instruction `<name>` spells.

use doorbell_kernels::{kernel, ptx};

macro_rules! golden {
    (ld, $scope:ident, $sem:ident, $ord:ident, $ty:ident, $($rest:tt)*) => {
        paste::paste! {
            #[kernel]
            pub unsafe fn [<golden_ld_ $sem _ $scope _ $ty>](p: *const $ty, out: *mut $ty) {
                // SAFETY: the test passes valid, aligned words.
                unsafe { *out = ptx::[<ld_ $sem _ $scope _ $ty>](p) }
            }
        }
    };
    (st, $scope:ident, $sem:ident, $ord:ident, $ty:ident, $($rest:tt)*) => {
        paste::paste! {
            #[kernel]
            pub unsafe fn [<golden_st_ $sem _ $scope _ $ty>](p: *mut $ty, v: $ty) {
                // SAFETY: as above.
                unsafe { ptx::[<st_ $sem _ $scope _ $ty>](p, v) }
            }
        }
    };
    (fence, $scope:ident, $sem:ident, $ord:ident) => {
        paste::paste! {
            #[kernel]
            pub unsafe fn [<golden_fence_ $sem _ $scope>]() {
                ptx::[<fence_ $sem _ $scope>]()
            }
        }
    };
    (atom, $scope:ident, $op:ident, $ptxop:literal, $tyk:literal, $sem:ident, $ord:ident, $ty:ident, $($rest:tt)*) => {
        paste::paste! {
            #[kernel]
            pub unsafe fn [<golden_atom_ $op _ $sem _ $scope _ $ty>](p: *mut $ty, v: $ty, out: *mut $ty) {
                // SAFETY: as above.
                unsafe { *out = ptx::[<atom_ $op _ $sem _ $scope _ $ty>](p, v) }
            }
        }
    };
    (cas, $scope:ident, $sem:ident, $ord:ident, $fail:ident, $ty:ident, $($rest:tt)*) => {
        paste::paste! {
            #[kernel]
            pub unsafe fn [<golden_atom_cas_ $sem _ $scope _ $ty>](p: *mut $ty, c: $ty, n: $ty, out: *mut $ty) {
                // SAFETY: as above.
                unsafe { *out = ptx::[<atom_cas_ $sem _ $scope _ $ty>](p, c, n) }
            }
        }
    };
}

doorbell_kernels::ordering_table!(golden);
