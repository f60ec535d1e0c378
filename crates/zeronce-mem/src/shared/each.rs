//! Claims of several blocks at once ([`SharedRam::claim_bare_each`],
//! [`SharedRam::release_each`]): an allocator that moves a batch of blocks between its
//! free lists and its holders claims and releases their bytes together, one atomic step
//! for the blocks that share a word of the claim map (the 2 MiB blocks of one 16
//! MiB-aligned stretch) instead of one or two per block.

use super::{ClaimError, RamClaim, SharedRam};
use crate::claims::ClaimMap;

impl SharedRam {
    /// Claims each range of `ranges` (offset and length, as [`SharedRam::claim_bare`]
    /// takes them) and calls `ok` with the range's index and its claim, or `failed` with
    /// the index and the error, in index order. Neighbouring ranges that are each whole
    /// 64-page groups of one word of the claim map are claimed with one atomic step
    /// together; when that step finds any page of them busy, each is claimed on its own,
    /// as `claim_bare` would, so the results are `claim_bare`'s one by one.
    pub fn claim_bare_each(
        &self,
        ranges: &[(usize, usize)],
        mut ok: impl FnMut(usize, RamClaim),
        mut failed: impl FnMut(usize, ClaimError),
    ) {
        // The current run of ranges ends before `run_end`; `together`: its step claimed
        // all of them (else they are claimed one by one: a page busy, or no run).
        let (mut run_end, mut together) = (0, false);
        for (i, &(offset, len)) in ranges.iter().enumerate() {
            if i == run_end {
                let n;
                (n, together) = self.claim_run(&ranges[i..]);
                run_end = i + n;
            }
            // One call of `ok`, so it is inlined here, and the claim goes to it as its
            // three words, never through a `Result` or a pointer to memory: one built
            // there word by word and read back in 16-byte pieces was a store-forwarding
            // stall a block.
            if together || self.claim_alone(i, offset, len, &mut failed) {
                ok(
                    i,
                    RamClaim {
                        ram: self.id,
                        offset,
                        len,
                    },
                );
            }
        }
    }

    /// [`SharedRam::claim_bare_each`] of one range on its own: whether it was claimed
    /// (the claim is `claim_bare`'s, the words of the range: the caller makes it again).
    #[inline(never)]
    fn claim_alone(
        &self,
        i: usize,
        offset: usize,
        len: usize,
        failed: &mut impl FnMut(usize, ClaimError),
    ) -> bool {
        match self.claim_bare(offset, len) {
            Ok(RamClaim { .. }) => true,
            Err(e) => {
                failed(i, e);
                false
            }
        }
    }

    /// The run of ranges at the start of `ranges` (one at least) whose groups are whole
    /// groups of one word of the claim map, none twice, and whether that run (one range
    /// or more) was claimed with one atomic step; else its ranges are to be claimed one by
    /// one.
    fn claim_run(&self, ranges: &[(usize, usize)]) -> (usize, bool) {
        let Some((word, mut mask)) = ranges.first().and_then(|&r| self.whole_groups(r)) else {
            return (1, false);
        };
        let mut end = 1;
        while let Some((w, m)) = ranges.get(end).and_then(|&r| self.whole_groups(r)) {
            if w != word || m & mask != 0 {
                break;
            }
            mask |= m;
            end += 1;
        }
        (end, self.claims.try_claim_groups(word, mask).is_ok())
    }

    /// Ends each of `claims`, as [`SharedRam::release`] would one by one; neighbouring
    /// claims of whole groups of one word of the claim map end with one atomic step.
    ///
    /// # Panics
    /// At a claim of another RAM (a caller's bug), after ending the claims before it;
    /// that claim and the ones after it are not released.
    pub fn release_each(&self, claims: impl IntoIterator<Item = RamClaim>) {
        let mut pending: Option<(usize, u64)> = None;
        let flush = |pending: &mut Option<(usize, u64)>| {
            if let Some((word, mask)) = pending.take() {
                self.claims.release_groups(word, mask);
            }
        };
        for claim in claims {
            if claim.ram != self.id {
                flush(&mut pending);
            }
            self.check(&claim);
            let (first, end) = Self::pages_of(claim.offset, claim.len);
            match ClaimMap::whole_groups(first, end) {
                Some((word, mask)) => match &mut pending {
                    Some((w, m)) if *w == word => *m |= mask,
                    _ => {
                        flush(&mut pending);
                        pending = Some((word, mask));
                    }
                },
                None => self.claims.release(first, end),
            }
        }
        flush(&mut pending);
    }

    /// The claim-map word and bits of the range `(offset, len)` when it is whole groups
    /// of one word and inside the RAM (else `claim_bare` reports what it is).
    fn whole_groups(&self, (offset, len): (usize, usize)) -> Option<(usize, u64)> {
        let end = offset.checked_add(len)?;
        if len == 0 || end > self.ram.len() {
            return None;
        }
        let (first, last) = Self::pages_of(offset, len);
        ClaimMap::whole_groups(first, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ram::{BackingKind, GuestRam};
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    const HUGE: usize = 2 << 20;

    fn ram() -> Arc<SharedRam> {
        SharedRam::new(GuestRam::new(64 << 20, BackingKind::Anonymous { thp: false }).unwrap())
    }

    fn claim_each(r: &SharedRam, ranges: &[(usize, usize)]) -> Vec<Result<RamClaim, ClaimError>> {
        let out = std::cell::RefCell::new(Vec::new());
        let push = |i: usize, c| {
            let mut out = out.borrow_mut();
            assert_eq!(i, out.len(), "in index order");
            out.push(c);
        };
        r.claim_bare_each(ranges, |i, c| push(i, Ok(c)), |i, e| push(i, Err(e)));
        out.into_inner()
    }

    #[test]
    fn the_blocks_of_one_word_are_claimed_together_and_exclude_everyone_else() {
        let r = ram();
        // Eight 2 MiB blocks of the first 16 MiB, out of order, then two of the next.
        let ranges: Vec<_> = [3, 0, 1, 2, 7, 6, 5, 4, 8, 9]
            .iter()
            .map(|&b| (b * HUGE, HUGE))
            .collect();
        let claims: Vec<_> = claim_each(&r, &ranges)
            .into_iter()
            .map(Result::unwrap)
            .collect();
        for (c, &(offset, len)) in claims.iter().zip(&ranges) {
            assert_eq!((c.offset(), c.len()), (offset, len));
            assert!(r.claim_bare(offset + 4096, 1).is_err(), "held: {offset:#x}");
        }
        assert!(r.claim_bare(10 * HUGE, HUGE).is_ok(), "not claimed");
        r.release_each(claims);
        let all = r.claim_bare(0, 10 * HUGE).unwrap();
        r.release(all);
    }

    #[test]
    fn a_busy_block_fails_alone_and_the_others_are_claimed_one_by_one() {
        let r = ram();
        let held = r.claim_bare(2 * HUGE + 4096, 4096).unwrap();
        let ranges: Vec<_> = (0..4).map(|b| (b * HUGE, HUGE)).collect();
        let out = claim_each(&r, &ranges);
        assert!(matches!(
            out[2],
            Err(ClaimError::Busy { busy_offset, .. }) if busy_offset == 2 * HUGE + 4096
        ));
        let claims: Vec<_> = out.into_iter().filter_map(Result::ok).collect();
        assert_eq!(claims.len(), 3);
        r.release_each(claims);
        r.release(held);
        r.release(r.claim_bare(0, 4 * HUGE).unwrap());
    }

    #[test]
    fn small_ranges_repeats_and_bad_ranges_get_what_claim_bare_gives() {
        let r = ram();
        let len = r.len();
        let ranges = [
            (0, HUGE),
            (0, HUGE),
            (HUGE, 4096),
            (len, HUGE),
            (HUGE * 2, 0),
            (HUGE * 3, HUGE),
        ];
        let out = claim_each(&r, &ranges);
        assert!(out[0].is_ok());
        assert!(
            matches!(out[1], Err(ClaimError::Busy { .. })),
            "twice in one call"
        );
        assert!(out[2].is_ok());
        assert!(matches!(out[3], Err(ClaimError::OutOfRange { .. })));
        assert!(matches!(out[4], Err(ClaimError::OutOfRange { .. })));
        assert!(out[5].is_ok());
        r.release_each(out.into_iter().filter_map(Result::ok));
        r.release(r.claim_bare(0, len).unwrap());
    }

    #[test]
    #[should_panic(expected = "a claim of another SharedRam")]
    fn a_claim_of_another_ram_is_refused_after_the_ones_before_it_end() {
        let (a, b) = (ram(), ram());
        let mine = a.claim_bare(0, HUGE).unwrap();
        let theirs = b.claim_bare(0, HUGE).unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            a.release_each([mine, theirs]);
        }));
        assert!(a.claim_bare(0, HUGE).is_ok(), "the one before it ended");
        std::panic::resume_unwind(result.unwrap_err());
    }

    #[test]
    fn racing_batches_and_single_claims_never_both_hold_a_block() {
        let r = ram();
        let inside: Vec<_> = (0..8)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect();
        let ranges: Vec<_> = (0..8).map(|b| (b * HUGE, HUGE)).collect();
        std::thread::scope(|s| {
            let (r, inside, ranges) = (&r, &inside, &ranges);
            s.spawn(move || {
                for _ in 0..if cfg!(miri) { 50 } else { 5_000 } {
                    let mut held = Vec::new();
                    r.claim_bare_each(
                        ranges,
                        |i, c| {
                            assert_eq!(inside[i].fetch_add(1, Relaxed), 0);
                            held.push((i, c));
                        },
                        |_, _| {},
                    );
                    for (i, _) in &held {
                        inside[*i].fetch_sub(1, Relaxed);
                    }
                    r.release_each(held.into_iter().map(|(_, c)| c));
                }
            });
            s.spawn(move || {
                for n in 0..if cfg!(miri) { 400 } else { 40_000usize } {
                    let i = n % 8;
                    if let Ok(c) = r.claim_bare(i * HUGE + (n % 512) * 4096, 4096) {
                        assert_eq!(inside[i].fetch_add(1, Relaxed), 0);
                        inside[i].fetch_sub(1, Relaxed);
                        r.release(c);
                    }
                }
            });
        });
        r.release(r.claim_bare(0, r.len()).unwrap());
    }
}
