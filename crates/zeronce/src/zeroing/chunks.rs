//! [`ChunkStates`]: the state byte of every chunk of a [`super::zeromap::ZeroMap`], eight
//! to an atomic word, so that the chunks of a batch of blocks handed out or freed together
//! (the 2 MiB blocks of one 16 MiB-aligned stretch) change with one compare-and-swap
//! instead of one each. Every change of a byte is a compare-and-swap of its word: the
//! bytes beside it are carried over as they were read, so a change never undoes another.

use std::sync::atomic::{AtomicU64, Ordering::*};

/// Chunk states per word.
const LANES: usize = 8;

/// Mask of one lane's byte.
const LANE: u64 = 0xff;

/// A chunk's word and the shift of its byte in it.
#[inline]
fn lane(i: usize) -> (usize, u32) {
    (i / LANES, (i % LANES) as u32 * 8)
}

/// One state byte per chunk, eight to a word (see the module docs).
pub(crate) struct ChunkStates {
    words: Box<[AtomicU64]>,
    len: usize,
}

/// Changes of some chunks of one word, gathered to be made at once.
#[derive(Clone, Copy)]
struct Pending {
    word: usize,
    /// The bytes that change.
    mask: u64,
    /// Their new values, in place.
    values: u64,
}

impl ChunkStates {
    /// `len` chunks, each `init`.
    pub(crate) fn new(len: usize, init: u8) -> ChunkStates {
        let word = u64::from_ne_bytes([init; LANES]);
        ChunkStates {
            words: (0..len.div_ceil(LANES))
                .map(|_| AtomicU64::new(word))
                .collect(),
            len,
        }
    }

    /// Number of chunks.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Chunk `i`'s state, its word loaded with `ordering`.
    #[inline]
    pub(crate) fn get(&self, i: usize, ordering: std::sync::atomic::Ordering) -> u8 {
        let (w, shift) = lane(i);
        (self.words[w].load(ordering) >> shift) as u8
    }

    /// Replaces chunk `i`'s state `from` with `to`; whether it was `from`.
    pub(crate) fn replace(&self, i: usize, from: u8, to: u8) -> bool {
        let (w, shift) = lane(i);
        self.words[w]
            .fetch_update(AcqRel, Relaxed, |cur| {
                ((cur >> shift) as u8 == from).then_some(with(cur, shift, to))
            })
            .is_ok()
    }

    /// Waits out `busy` on chunk `i`, then sets it to `new`; the previous state. No write
    /// when it already is `new` (small blocks of a chunk in use: no cache-line transfer).
    pub(crate) fn set(&self, i: usize, new: u8, busy: u8) -> u8 {
        let (w, shift) = lane(i);
        let mut prev = new;
        self.update(
            Pending {
                word: w,
                mask: LANE << shift,
                values: u64::from(new) << shift,
            },
            busy,
            |cur| prev = (cur >> shift) as u8,
        );
        prev
    }

    /// Sets each chunk `i` of `changes` to its state, waiting out `busy` as
    /// [`ChunkStates::set`] does: the chunks of one word (neighbours in `changes`) with one
    /// compare-and-swap.
    pub(crate) fn set_each(&self, changes: impl IntoIterator<Item = (usize, u8)>, busy: u8) {
        let mut pending: Option<Pending> = None;
        for (i, new) in changes {
            let (w, shift) = lane(i);
            let byte = LANE << shift;
            match &mut pending {
                // The same chunk twice is two changes, one after the other.
                Some(p) if p.word == w && p.mask & byte == 0 => {
                    p.mask |= byte;
                    p.values |= u64::from(new) << shift;
                }
                _ => {
                    if let Some(p) = pending {
                        self.update(p, busy, |_| {});
                    }
                    pending = Some(Pending {
                        word: w,
                        mask: byte,
                        values: u64::from(new) << shift,
                    });
                }
            }
        }
        if let Some(p) = pending {
            self.update(p, busy, |_| {});
        }
    }

    /// Makes the changes `p` once none of its chunks is `busy` (yielding meanwhile);
    /// `seen` gets the word the change was made on (or found already made on).
    fn update(&self, p: Pending, busy: u8, mut seen: impl FnMut(u64)) {
        let word = &self.words[p.word];
        let busy_bytes = u64::from_ne_bytes([busy; LANES]) & p.mask;
        loop {
            let cur = word.load(Acquire);
            // A byte is `busy` when it equals it: compare byte-wise under the mask.
            if has_equal_byte(cur & p.mask, busy_bytes, p.mask) {
                std::thread::yield_now();
                continue;
            }
            let new = (cur & !p.mask) | p.values;
            if new == cur {
                seen(cur);
                return;
            }
            if word.compare_exchange(cur, new, AcqRel, Acquire).is_ok() {
                seen(cur);
                return;
            }
        }
    }
}

/// `cur` with the byte at `shift` set to `value`.
#[inline]
fn with(cur: u64, shift: u32, value: u8) -> u64 {
    (cur & !(LANE << shift)) | (u64::from(value) << shift)
}

/// Whether a byte of `mask` (whole bytes) is the same in `a` and `b`.
#[inline]
fn has_equal_byte(a: u64, b: u64, mask: u64) -> bool {
    // The bytes outside the mask differ (all ones); then whether any byte is zero, the
    // classic test: a zero byte's borrow sets its top bit, and a byte that is not zero
    // sets no top bit of its own unless it already had it (masked out by `!v`).
    const ONES: u64 = u64::from_ne_bytes([0x01; LANES]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; LANES]);
    let v = (a ^ b) | !mask;
    v.wrapping_sub(ONES) & !v & HIGHS != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUSY: u8 = 3;

    #[test]
    fn the_word_test_of_equal_bytes_is_the_byte_by_byte_one() {
        let byte_by_byte = |a: u64, b: u64, mask: u64| {
            (0..8).any(|k| {
                let byte = LANE << (k * 8);
                mask & byte != 0 && (a ^ b) & byte == 0
            })
        };
        // Words whose bytes are drawn from a few values (equal, off by one bit, by the
        // top bit), every mask of whole bytes.
        let values = [0u8, 1, 2, 3, 0x7f, 0x80, 0x81, 0xfe, 0xff];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut word = || {
                u64::from_ne_bytes(std::array::from_fn(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    values[(seed % values.len() as u64) as usize]
                }))
            };
            let (a, b) = (word(), word());
            for bytes in 0..=255u8 {
                let mask = u64::from_ne_bytes(std::array::from_fn(|k| {
                    if bytes & (1 << k) != 0 {
                        0xff
                    } else {
                        0
                    }
                }));
                assert_eq!(
                    has_equal_byte(a, b, mask),
                    byte_by_byte(a, b, mask),
                    "{a:#x} {b:#x} {mask:#x}"
                );
            }
        }
    }

    #[test]
    fn each_chunk_keeps_its_own_byte() {
        let s = ChunkStates::new(20, 1);
        assert_eq!(s.len(), 20);
        assert_eq!(s.set(9, 0, BUSY), 1);
        assert_eq!(s.set(9, 0, BUSY), 0);
        s.set_each([(3, 2), (0, 0), (7, 2), (8, 2), (19, 0)], BUSY);
        let all: Vec<u8> = (0..20).map(|i| s.get(i, Acquire)).collect();
        assert_eq!(
            all,
            [0, 1, 1, 2, 1, 1, 1, 2, 2, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]
        );
        assert!(s.replace(4, 1, BUSY));
        assert!(!s.replace(4, 1, BUSY), "not 1 any more");
        assert!(s.replace(4, BUSY, 2));
        assert_eq!(s.get(4, Relaxed), 2);
    }

    #[test]
    fn a_chunk_twice_in_one_batch_ends_with_the_later_state() {
        let s = ChunkStates::new(8, 1);
        s.set_each([(2, 0), (2, 2), (5, 0)], BUSY);
        assert_eq!((s.get(2, Acquire), s.get(5, Acquire)), (2, 0));
    }

    #[test]
    fn a_batch_waits_for_a_busy_chunk_of_it_and_not_for_its_neighbours() {
        let s = std::sync::Arc::new(ChunkStates::new(8, 1));
        assert!(s.replace(1, 1, BUSY));
        // A busy neighbour outside the batch does not hold it up.
        s.set_each([(0, 0), (2, 0)], BUSY);
        assert_eq!(s.get(1, Acquire), BUSY);
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.set_each([(0, 2), (1, 0)], BUSY))
        };
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(s.get(0, Acquire), 0, "waits for chunk 1");
        assert!(s.replace(1, BUSY, 1));
        t.join().unwrap();
        assert_eq!((s.get(0, Acquire), s.get(1, Acquire)), (2, 0));
    }

    #[test]
    fn racing_byte_changes_of_one_word_are_never_lost() {
        let s = ChunkStates::new(8, 0);
        std::thread::scope(|sc| {
            for t in 0..2usize {
                let s = &s;
                sc.spawn(move || {
                    for n in 0..if cfg!(miri) { 100 } else { 20_000u32 } {
                        // Thread 0 owns chunks 0..4, thread 1 chunks 4..8.
                        let base = t * 4;
                        let v = (n % 3) as u8;
                        s.set_each((base..base + 4).map(|i| (i, v)), BUSY);
                        for i in base..base + 4 {
                            assert_eq!(s.get(i, Acquire), v);
                        }
                    }
                });
            }
        });
    }
}
