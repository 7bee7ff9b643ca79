//! Progress through a list of buffers that vectored I/O sends or fills piecewise. Pure
//! bookkeeping, shared by the initiator (pipelined requests and answers) and the server
//! (gathered READ answers).

use std::io::{IoSlice, IoSliceMut};

/// Most buffers handed to one vectored call (the kernel's limit is 1024).
pub(crate) const MAX_IOV: usize = 128;

/// The first byte not yet moved: `parts[part][offset]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Cursor {
    /// Index of the part in progress (the number of parts when done).
    pub(crate) part: usize,
    /// Bytes of that part already moved.
    pub(crate) offset: usize,
}

impl Cursor {
    /// Moves past `n` bytes of parts whose lengths `len_of` gives, skipping empty parts.
    pub(crate) fn advance(&mut self, mut n: usize, parts: usize, len_of: impl Fn(usize) -> usize) {
        while self.part < parts {
            let left = len_of(self.part) - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.part += 1;
            self.offset = 0;
        }
    }

    /// Buffers for the next vectored write: the rest of `parts[..end]` from the cursor, at
    /// most [`MAX_IOV`] of them.
    pub(crate) fn unsent<'a>(&self, parts: &'a [&[u8]], end: usize) -> Vec<IoSlice<'a>> {
        parts[self.part.min(end)..end]
            .iter()
            .take(MAX_IOV)
            .enumerate()
            .map(|(i, part)| IoSlice::new(if i == 0 { &part[self.offset..] } else { part }))
            .collect()
    }

    /// Buffers for the next vectored read: the rest of `parts[..end]` from the cursor, at
    /// most [`MAX_IOV`] of them.
    pub(crate) fn unfilled<'a>(
        &self,
        parts: &'a mut [&mut [u8]],
        end: usize,
    ) -> Vec<IoSliceMut<'a>> {
        let offset = self.offset;
        parts[self.part.min(end)..end]
            .iter_mut()
            .take(MAX_IOV)
            .enumerate()
            .map(|(i, part)| IoSliceMut::new(if i == 0 { &mut part[offset..] } else { part }))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_across_parts_and_builds_the_rest() {
        let (a, b, c) = ([1u8; 3], [2u8; 0], [3u8; 4]);
        let parts: Vec<&[u8]> = vec![&a, &b, &c];
        let len_of = |i: usize| parts[i].len();
        let mut cursor = Cursor::default();
        cursor.advance(2, 3, len_of);
        assert_eq!(cursor, Cursor { part: 0, offset: 2 });
        let rest = cursor.unsent(&parts, 3);
        assert_eq!(
            rest.iter().map(|s| s.len()).collect::<Vec<_>>(),
            vec![1, 0, 4]
        );
        cursor.advance(1, 3, len_of);
        assert_eq!(
            cursor,
            Cursor { part: 2, offset: 0 },
            "empty parts are skipped"
        );
        cursor.advance(3, 3, len_of);
        assert_eq!(cursor, Cursor { part: 2, offset: 3 });
        assert_eq!(cursor.unsent(&parts, 2).len(), 0);
        cursor.advance(1, 3, len_of);
        assert_eq!(cursor, Cursor { part: 3, offset: 0 });

        let (mut x, mut y) = ([0u8; 2], [0u8; 5]);
        let mut fill: Vec<&mut [u8]> = vec![&mut x, &mut y];
        let cursor = Cursor { part: 1, offset: 1 };
        let io = cursor.unfilled(&mut fill, 2);
        assert_eq!(io.len(), 1);
        assert_eq!(io[0].len(), 4);
    }
}
