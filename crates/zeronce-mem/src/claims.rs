//! [`ClaimMap`]: which 4 KiB pages of a [`crate::SharedRam`] a live claim holds, in two
//! levels of bits so that claiming and releasing costs one or two atomic operations for a
//! small block and for a 2 MiB block alike.
//!
//! - Level 0: one bit per page. A claim sets the bits of the pages it holds in a *group*
//!   (64 aligned pages) it does not cover whole.
//! - Level 1: one bit per group. A claim sets the bit of every group it covers whole.
//! - Beside level 1, one *partial* bit per group: set (once, and never cleared) by the
//!   first level-0 claim in the group. A group no level-0 claim has touched has no
//!   level-0 bits to read.
//!
//! A claim that sets level-0 bits of group `g` then sets `g`'s partial bit (unless set)
//! and reads `g`'s level-1 bit; one that sets `g`'s level-1 bit then reads `g`'s partial
//! bit and, only if set, `g`'s level-0 word. Sets and reads are all `SeqCst`, so of two
//! overlapping claims at least one sees the other (Dekker's argument over the single
//! total order of `SeqCst` operations: a level-0 claimer whose level-1 read missed the
//! group's bit made its level-0 and partial bits before that bit was set, so the group
//! claimer's later reads see both; the partial bit, never cleared, cannot be gone by
//! then) and rolls back: two overlapping claims never both succeed. Two that race may both
//! roll back; the caller retries. A claim of a 16 MiB stretch of groups no small claim
//! touched reads one partial word instead of the stretch's 64 level-0 words. The release
//! of a claim and the reads or sets of the next claimer of the same pages are
//! release/acquire pairs, so the next owner sees every write of the previous one.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

const GROUP: usize = 64;

/// Claimed pages of one RAM (see the module docs).
#[derive(Debug)]
pub(crate) struct ClaimMap {
    /// Level 0: bit `p % 64` of word `p / 64` = page `p` held by a partial-group claim.
    pages: Box<[AtomicU64]>,
    /// Level 1: bit `g % 64` of word `g / 64` = group `g` held whole.
    groups: Box<[AtomicU64]>,
    /// Bit `g % 64` of word `g / 64` = group `g` has had a level-0 claim (sticky).
    partial: Box<[AtomicU64]>,
}

/// Bits `[lo, hi)` of a word.
fn mask(lo: usize, hi: usize) -> u64 {
    if hi - lo == 64 {
        u64::MAX
    } else {
        ((1u64 << (hi - lo)) - 1) << lo
    }
}

/// One piece of a claim: some pages of one group, or a run of whole groups within one
/// level-1 word.
#[derive(Clone, Copy, Debug)]
enum Piece {
    /// Level-0 word `word`, bits `mask`.
    Pages { word: usize, mask: u64 },
    /// Level-1 word `word`, bits `mask` (groups `word * 64 + bit`).
    Groups { word: usize, mask: u64 },
}

/// The pieces of pages `[first, end)`, in address order.
fn pieces(first: usize, end: usize) -> impl Iterator<Item = Piece> {
    let mut at = first;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let group = at / GROUP;
        let group_end = (group + 1) * GROUP;
        if !at.is_multiple_of(GROUP) || end < group_end {
            let hi = end.min(group_end);
            let piece = Piece::Pages {
                word: group,
                mask: mask(at - group * GROUP, hi - group * GROUP),
            };
            at = hi;
            return Some(piece);
        }
        // Whole groups from `group`, up to the end of the range or of this level-1 word.
        let whole_end = (end / GROUP).min((group / 64 + 1) * 64);
        let word = group / 64;
        let piece = Piece::Groups {
            word,
            mask: mask(group - word * 64, whole_end - word * 64),
        };
        at = whole_end * GROUP;
        Some(piece)
    })
}

/// The piece of pages `[first, end)` when they make one (pages inside one group, or whole
/// groups inside one level-1 word: every naturally aligned block of up to 4096 pages), so
/// the common claim of one buddy block skips the general walk of [`pieces`].
#[inline]
fn single_piece(first: usize, end: usize) -> Option<Piece> {
    let group = first / GROUP;
    let group_end = (group + 1) * GROUP;
    let whole = first.is_multiple_of(GROUP) && end.is_multiple_of(GROUP);
    if end <= group_end && !(whole && end == group_end) {
        let base = group * GROUP;
        return Some(Piece::Pages {
            word: group,
            mask: mask(first - base, end - base),
        });
    }
    let word = group / 64;
    if !whole || (end / GROUP - 1) / 64 != word {
        return None;
    }
    Some(Piece::Groups {
        word,
        mask: mask(group - word * 64, end / GROUP - word * 64),
    })
}

impl ClaimMap {
    /// The map of `pages` pages, none claimed: zeroed allocations, so a map of a large
    /// range is address space backed only where claims write bits.
    pub(crate) fn new(pages: usize) -> Self {
        let groups = pages.div_ceil(GROUP);
        let words = bytemuck::zeroed_slice_box::<AtomicU64>;
        ClaimMap {
            pages: words(groups),
            groups: words(groups.div_ceil(64)),
            partial: words(groups.div_ceil(64)),
        }
    }

    /// Claims pages `[first, end)` if no live claim holds any of them; else rolls back
    /// and returns a page that was busy.
    #[inline]
    pub(crate) fn try_claim(&self, first: usize, end: usize) -> Result<(), usize> {
        if let Some(piece) = single_piece(first, end) {
            return self.take(piece);
        }
        for (taken, piece) in pieces(first, end).enumerate() {
            if let Err(busy) = self.take(piece) {
                pieces(first, end).take(taken).for_each(|p| self.give(p));
                return Err(busy);
            }
        }
        Ok(())
    }

    /// Releases pages `[first, end)`, claimed by one successful [`ClaimMap::try_claim`].
    #[inline]
    pub(crate) fn release(&self, first: usize, end: usize) {
        match single_piece(first, end) {
            Some(piece) => self.give(piece),
            None => pieces(first, end).for_each(|p| self.give(p)),
        }
    }

    /// The level-1 word and bits of pages `[first, end)` when they are whole groups of
    /// one level-1 word (a naturally aligned block of 64 to 4096 pages, a 2 MiB block
    /// among them): the claims [`ClaimMap::try_claim_groups`] takes together.
    #[inline]
    pub(crate) fn whole_groups(first: usize, end: usize) -> Option<(usize, u64)> {
        // What `single_piece` finds for whole groups, in arithmetic (no walk of its
        // cases: a batch's claims ask this of every block).
        if !(first | end).is_multiple_of(GROUP) || end <= first {
            return None;
        }
        let (lo, hi) = (first / GROUP, end / GROUP);
        let word = lo / 64;
        if (hi - 1) / 64 != word {
            return None;
        }
        Some((word, mask(lo - word * 64, hi - word * 64)))
    }

    /// Claims groups `mask` of level-1 word `word` at once: several claims' bits, each
    /// found by [`ClaimMap::whole_groups`], in one compare-and-swap. Same argument as one
    /// claim (the module docs): the set bits are one claim of the union, and each claim's
    /// own release clears only its own.
    #[inline]
    pub(crate) fn try_claim_groups(&self, word: usize, mask: u64) -> Result<(), usize> {
        self.take(Piece::Groups { word, mask })
    }

    /// Releases groups `mask` of level-1 word `word` at once (the groups of several
    /// claims, each claimed whole).
    #[inline]
    pub(crate) fn release_groups(&self, word: usize, mask: u64) {
        self.give(Piece::Groups { word, mask });
    }

    /// Sets the bits of `piece` (none may be set), then checks the other level.
    #[inline]
    fn take(&self, piece: Piece) -> Result<(), usize> {
        let (word, mask, base) = match piece {
            Piece::Pages { word, mask } => (&self.pages[word], mask, word * GROUP),
            Piece::Groups { word, mask } => (&self.groups[word], mask, word * 64 * GROUP),
        };
        let scale = match piece {
            Piece::Pages { .. } => 1,
            Piece::Groups { .. } => GROUP,
        };
        let mut cur = word.load(SeqCst);
        loop {
            if cur & mask != 0 {
                return Err(base + (cur & mask).trailing_zeros() as usize * scale);
            }
            match word.compare_exchange_weak(cur, cur | mask, SeqCst, SeqCst) {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        let other = match piece {
            // Our pages' group must not be held whole; it is marked as having had a
            // partial claim first (the module docs: a group claimer reads that mark).
            Piece::Pages { word: group, .. } => {
                let (w, bit) = (group / 64, 1u64 << (group % 64));
                if self.partial[w].load(SeqCst) & bit == 0 {
                    self.partial[w].fetch_or(bit, SeqCst);
                }
                let held = self.groups[w].load(SeqCst) & bit != 0;
                held.then_some(group * GROUP)
            }
            // No page of our whole groups may be held by a partial claim: the level-0
            // words of the groups that ever had one are read, the lowest held page named.
            Piece::Groups { word: w, mask } => {
                let mut touched = self.partial[w].load(SeqCst) & mask;
                let mut busy = None;
                while touched != 0 && busy.is_none() {
                    let g = w * 64 + touched.trailing_zeros() as usize;
                    let bits = self.pages[g].load(SeqCst);
                    busy = (bits != 0).then(|| g * GROUP + bits.trailing_zeros() as usize);
                    touched &= touched - 1;
                }
                busy
            }
        };
        match other {
            None => Ok(()),
            Some(busy) => {
                self.give(piece);
                Err(busy)
            }
        }
    }

    #[inline]
    fn give(&self, piece: Piece) {
        match piece {
            Piece::Pages { word, mask } => self.pages[word].fetch_and(!mask, SeqCst),
            Piece::Groups { word, mask } => self.groups[word].fetch_and(!mask, SeqCst),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_partial_groups_from_whole_ones() {
        let p: Vec<_> = pieces(60, 64 * 70 + 3).collect();
        assert!(matches!(p[0], Piece::Pages { word: 0, mask } if mask == 0xf << 60));
        // Groups 1..64 fill level-1 word 0 from bit 1; groups 64..70 start word 1.
        assert!(matches!(p[1], Piece::Groups { word: 0, mask } if mask == u64::MAX << 1));
        assert!(matches!(p[2], Piece::Groups { word: 1, mask } if mask == 0x3f));
        assert!(matches!(
            p[3],
            Piece::Pages {
                word: 70,
                mask: 0b111
            }
        ));
        assert_eq!(p.len(), 4);
        assert_eq!(pieces(128, 192).count(), 1);
        assert_eq!(pieces(5, 6).count(), 1);
    }

    #[test]
    fn single_piece_is_the_walk_when_the_walk_has_one_piece() {
        let starts = [0, 1, 5, 63, 64, 100, 4032, 4096, 4160, 8191];
        for first in starts {
            for len in [1, 2, 7, 8, 59, 63, 64, 65, 128, 512, 4000, 4096, 4097, 8192] {
                let end = first + len;
                let walk: Vec<_> = pieces(first, end).collect();
                let single = single_piece(first, end);
                match (walk.as_slice(), single) {
                    ([Piece::Pages { word, mask }], Some(Piece::Pages { word: w, mask: m }))
                    | ([Piece::Groups { word, mask }], Some(Piece::Groups { word: w, mask: m })) => {
                        assert_eq!((*word, *mask), (w, m), "{first}..{end}");
                    }
                    ([_, _, ..], None) => {}
                    (walk, single) => panic!("{first}..{end}: walk {walk:?}, single {single:?}"),
                }
            }
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "arithmetic over many ranges, no unsafe: runs natively")]
    fn whole_groups_is_single_piece_for_whole_groups_and_nothing_else() {
        let expected = |first: usize, end: usize| match single_piece(first, end) {
            Some(Piece::Groups { word, mask }) => Some((word, mask)),
            _ => None,
        };
        // Every aligned start and end over three level-1 words (whole groups, across
        // words, up to a word and a bit long), and some unaligned ones.
        let span = 64 * 64 * 3;
        let firsts = (0..span).step_by(64).chain((1..=13).map(|k| k * 997));
        for first in firsts {
            for end in first + 1..(first + 64 * 64 + 130).min(span + 1) {
                let got = ClaimMap::whole_groups(first, end);
                assert_eq!(got, expected(first, end), "{first}..{end}");
            }
            // Empty or reversed: none (`single_piece` is never asked those).
            for end in first.saturating_sub(200)..=first {
                assert_eq!(ClaimMap::whole_groups(first, end), None, "{first}..{end}");
            }
        }
    }

    #[test]
    fn the_last_groups_of_a_map_ending_inside_a_word_are_claimed_whole_and_checked() {
        // Two level-1 words and 5 groups of a third.
        let groups = 64 * 2 + 5;
        let m = ClaimMap::new(groups * 64);
        let (word, mask) = ClaimMap::whole_groups(128 * 64, groups * 64).unwrap();
        assert_eq!((word, mask), (2, 0b1_1111));
        m.try_claim_groups(word, mask).unwrap();
        m.release_groups(word, mask);
        // A partial claim of the very last page fails the whole claim, naming that page.
        m.try_claim(groups * 64 - 1, groups * 64).unwrap();
        assert_eq!(m.try_claim_groups(word, mask), Err(groups * 64 - 1));
        m.release(groups * 64 - 1, groups * 64);
        m.try_claim(0, groups * 64).unwrap();
    }

    #[test]
    fn a_stretch_claim_and_a_racing_page_claim_in_it_never_both_hold() {
        // One thread claims a whole 16 MiB stretch (64 groups, one level-1 word) at once,
        // the other one page or a few, in a different group each round, some the first
        // in their group (no partial bit yet), some not.
        let m = ClaimMap::new(64 * 64 * 2);
        let holders = std::sync::atomic::AtomicUsize::new(0);
        let rounds = if cfg!(miri) { 100 } else { 20_000usize };
        std::thread::scope(|s| {
            let (m, holders) = (&m, &holders);
            s.spawn(move || {
                for _ in 0..rounds {
                    if m.try_claim_groups(0, u64::MAX).is_ok() {
                        assert_eq!(holders.fetch_add(1, SeqCst), 0, "both hold");
                        holders.fetch_sub(1, SeqCst);
                        m.release_groups(0, u64::MAX);
                    }
                }
            });
            s.spawn(move || {
                for i in 0..rounds {
                    let first = (i * 67) % (64 * 64 - 3);
                    if m.try_claim(first, first + 1 + i % 3).is_ok() {
                        assert_eq!(holders.fetch_add(1, SeqCst), 0, "both hold");
                        holders.fetch_sub(1, SeqCst);
                        m.release(first, first + 1 + i % 3);
                    }
                }
            });
        });
        // Every bit cleared: the stretch and the word after it claim whole again.
        m.try_claim(0, 64 * 64 * 2).unwrap();
    }

    #[test]
    fn a_group_that_had_a_partial_claim_is_checked_and_claimed_whole_once_free() {
        let m = ClaimMap::new(64 * 64);
        // Group 5 has a partial claim: a stretch claim fails and names its page.
        m.try_claim(5 * 64 + 9, 5 * 64 + 12).unwrap();
        assert_eq!(m.try_claim_groups(0, u64::MAX), Err(5 * 64 + 9));
        assert_eq!(m.try_claim_groups(0, 0b1110_0000), Err(5 * 64 + 9));
        // The groups beside it are not held up.
        m.try_claim_groups(0, 0b1101_1111).unwrap();
        m.release_groups(0, 0b1101_1111);
        // Released, the group claims whole though it keeps its partial mark.
        m.release(5 * 64 + 9, 5 * 64 + 12);
        m.try_claim_groups(0, u64::MAX).unwrap();
        assert!(m.try_claim(5 * 64 + 10, 5 * 64 + 11).is_err());
        m.release_groups(0, u64::MAX);
        m.try_claim(5 * 64 + 10, 5 * 64 + 11).unwrap();
    }

    #[test]
    fn whole_and_partial_claims_exclude_each_other() {
        let m = ClaimMap::new(64 * 200);
        m.try_claim(512, 1024).unwrap(); // groups 8..16 whole
        assert_eq!(m.try_claim(700, 701), Err(640)); // inside group 10
        assert!(m.try_claim(1000, 1100).is_err());
        m.try_claim(1024, 1025).unwrap();
        assert!(m.try_claim(0, 64 * 200).is_err());
        // The failed big claim left nothing behind.
        m.try_claim(0, 512).unwrap();
        m.release(512, 1024);
        m.try_claim(700, 701).unwrap();
        assert!(m.try_claim(640, 704).is_err());
        m.release(700, 701);
        m.try_claim(640, 704).unwrap();
    }
}
