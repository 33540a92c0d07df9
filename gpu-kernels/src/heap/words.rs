//! A [`CommError`] as four words, to move it between the lanes of a warp
//! (a warp-wide call returns the same error on every lane).

use super::{Arg, CommError};

impl CommError {
    /// The error as four words (a tag and its fields), for moving it
    /// between the lanes of a warp; [`Self::from_words`] reads it back.
    #[inline(always)]
    pub fn to_words(self) -> [u64; 4] {
        match self {
            CommError::Timeout(t) => [0, t.seen, 0, 0],
            CommError::Completion { peer, syndrome } => [1, peer as u64, syndrome as u64, 0],
            CommError::BadPeer { peer } => [2, peer as u64, 0, 0],
            CommError::OutOfRange { offset, bytes } => [3, offset, bytes, 0],
            CommError::Misaligned { offset } => [4, offset, 0, 0],
            CommError::BadCount { count } => [5, count, 0, 0],
            CommError::OutsideBuffer { arg, start, n, len } => [6 | (arg as u64) << 8, start, n, len],
            CommError::LengthMismatch { dst, src } => [7, dst, src, 0],
        }
    }

    /// The error [`Self::to_words`] wrote. Words no error writes read as
    /// `BadCount { count: tag }`.
    #[inline(always)]
    pub fn from_words(w: [u64; 4]) -> CommError {
        match w[0] & 0xff {
            0 => CommError::Timeout(crate::sync::Timeout { seen: w[1] }),
            1 => CommError::Completion {
                peer: w[1] as u32,
                syndrome: w[2] as u8,
            },
            2 => CommError::BadPeer { peer: w[1] as u32 },
            3 => CommError::OutOfRange { offset: w[1], bytes: w[2] },
            4 => CommError::Misaligned { offset: w[1] },
            5 => CommError::BadCount { count: w[1] },
            6 => CommError::OutsideBuffer {
                arg: Arg::from_u32((w[0] >> 8) as u32).unwrap_or(Arg::None),
                start: w[1],
                n: w[2],
                len: w[3],
            },
            7 => CommError::LengthMismatch { dst: w[1], src: w[2] },
            _ => CommError::BadCount { count: w[0] },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of error comes back from its words with every field, and
    /// words no error writes read as a `BadCount` naming the tag.
    #[test]
    fn an_error_survives_its_words() {
        let all = [
            CommError::Timeout(crate::sync::Timeout { seen: 0xdead_beef_0123 }),
            CommError::Completion { peer: 7, syndrome: 0x15 },
            CommError::BadPeer { peer: 9 },
            CommError::OutOfRange {
                offset: u64::MAX - 3,
                bytes: 17,
            },
            CommError::Misaligned { offset: 0x44 },
            CommError::BadCount { count: 65 },
            CommError::OutsideBuffer {
                arg: Arg::Signal,
                start: 5,
                n: 6,
                len: 7,
            },
            CommError::LengthMismatch { dst: 4, src: 5 },
        ];
        for e in all {
            assert_eq!(CommError::from_words(e.to_words()), e);
        }
        assert_eq!(CommError::from_words([0x3f, 1, 2, 3]), CommError::BadCount { count: 0x3f });
    }
}
