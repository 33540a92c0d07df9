//! CPU references of the collectives: what every rank must get, computed
//! the way the kernels compute it (sum in `f32`, rank order, one rounding).

use super::HostElement;

/// The sum all-reduce of `inputs` (one slice per rank, in rank order, all
/// the same length): element `i` is `inputs[0][i] + ... + inputs[n-1][i]`
/// summed in `f32` left to right and rounded once to `T` — bit for bit
/// what `AllReduce` produces.
///
/// # Panics
/// When the slices differ in length.
pub fn allreduce_sum<T: HostElement, S: AsRef<[T]>>(inputs: &[S]) -> Vec<T> {
    let Some(first) = inputs.first() else { return Vec::new() };
    let n = first.as_ref().len();
    assert!(
        inputs.iter().all(|s| s.as_ref().len() == n),
        "every rank's input must have the same length"
    );
    (0..n)
        .map(|i| {
            let mut acc = first.as_ref()[i].to_f32();
            for s in &inputs[1..] {
                acc += s.as_ref()[i].to_f32();
            }
            T::from_f32(acc)
        })
        .collect()
}

/// The sum all-reduce as the hierarchical algorithm computes it, for
/// ranks forming nodes of `node_ranks` consecutive ranks: each node's
/// inputs summed in `f32` in rank order and rounded to `T` (the node's
/// partial sum), then the partials summed in `f32` in node order and
/// rounded to `T` — bit for bit what `AllReduce` produces with
/// `Algo::Hierarchical`. With `node_ranks` of 1 or all ranks it is
/// [`allreduce_sum`].
///
/// # Panics
/// When the slices differ in length, or `node_ranks` is 0 or does not
/// divide the number of ranks.
pub fn allreduce_sum_nodes<T: HostElement, S: AsRef<[T]>>(inputs: &[S], node_ranks: usize) -> Vec<T> {
    assert!(
        node_ranks > 0 && inputs.len().is_multiple_of(node_ranks),
        "{node_ranks} ranks per node do not divide {} ranks",
        inputs.len()
    );
    let partials: Vec<Vec<T>> = inputs.chunks(node_ranks).map(allreduce_sum).collect();
    allreduce_sum(&partials)
}

/// The first index where `got` and `want` differ bit for bit (`None` when
/// they are identical, lengths included).
pub fn first_mismatch<T: HostElement>(got: &[T], want: &[T]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits())
}
