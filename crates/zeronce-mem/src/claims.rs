//! [`ClaimMap`]: which 4 KiB pages of a [`crate::SharedRam`] a live claim holds, in two
//! levels of bits so that claiming and releasing costs one or two atomic operations for a
//! small block and for a 2 MiB block alike.
//!
//! - Level 0: one bit per page. A claim sets the bits of the pages it holds in a *group*
//!   (64 aligned pages) it does not cover whole.
//! - Level 1: one bit per group. A claim sets the bit of every group it covers whole.
//!
//! A claim that sets level-0 bits of group `g` then reads `g`'s level-1 bit; one that sets
//! `g`'s level-1 bit then reads `g`'s level-0 word. Sets and reads are all `SeqCst`, so of
//! two overlapping claims at least one sees the other (Dekker's argument over the single
//! total order of `SeqCst` operations) and rolls back: two overlapping claims never both
//! succeed. Two that race may both roll back; the caller retries. The release of a claim
//! and the reads or sets of the next claimer of the same pages are release/acquire pairs,
//! so the next owner sees every write of the previous one.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

const GROUP: usize = 64;

/// Claimed pages of one RAM (see the module docs).
#[derive(Debug)]
pub(crate) struct ClaimMap {
    /// Level 0: bit `p % 64` of word `p / 64` = page `p` held by a partial-group claim.
    pages: Box<[AtomicU64]>,
    /// Level 1: bit `g % 64` of word `g / 64` = group `g` held whole.
    groups: Box<[AtomicU64]>,
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
    /// found by [`ClaimMap::whole_groups`], in one compare-and-swap. The check of the
    /// other level reads every group from the lowest bit to the highest, the gaps between
    /// the claims' groups too, so a partial claim in a gap fails them all: they are then
    /// retried one by one. Same argument as one claim (the module docs): the set bits are
    /// one claim of the union, and each claim's own release clears only its own.
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
            // Our pages' group must not be held whole.
            Piece::Pages { word: group, .. } => {
                let held = self.groups[group / 64].load(SeqCst) & (1 << (group % 64)) != 0;
                held.then_some(group * GROUP)
            }
            // No page of our whole groups may be held by a partial claim.
            Piece::Groups { word: w, mask } => {
                let (lo, hi) = (
                    mask.trailing_zeros() as usize,
                    64 - mask.leading_zeros() as usize,
                );
                let words = &self.pages[w * 64 + lo..w * 64 + hi];
                // All of them or-ed together first (a batch's claim reads 64 words;
                // a page held is the rare case), then which one.
                let any = words.iter().fold(0, |acc, word| acc | word.load(SeqCst));
                (any != 0).then(|| {
                    words
                        .iter()
                        .enumerate()
                        .find_map(|(i, word)| {
                            let bits = word.load(SeqCst);
                            (bits != 0)
                                .then(|| (w * 64 + lo + i) * GROUP + bits.trailing_zeros() as usize)
                        })
                        // Released between the two reads: some page was held during
                        // the claim, which fails all the same; the first one is named.
                        .unwrap_or((w * 64 + lo) * GROUP)
                })
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
