//! One random operation applied to the manager (directly or through the cache) and to
//! the model, with what must hold right after it.

use proptest::prelude::*;
use zeronce_mm::*;

use crate::ops::Op;
use crate::{fail, Page, World};

impl World {
    pub(crate) fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let before = self.mm.stats();
        match *op {
            Op::Alloc {
                via_cache,
                order,
                zeroed,
                hint,
                scribble,
            } => {
                let order = Order::new(order).unwrap();
                if via_cache && order <= self.mm.config().max_order {
                    let held = self.cache.cached_blocks();
                    let from_cache = !zeroed && order <= PCP_MAX_ORDER;
                    let none_left = self.available(order).iter().all(|&(kz, d)| kz + d == 0)
                        && !(from_cache && held.iter().any(|(_, b, _)| b.order == order));
                    if none_left && !held.is_empty() {
                        // The cache gives everything back before failing: do it first so the
                        // model follows, then run the step again on an empty cache.
                        self.cache.drain();
                        self.reconcile()?;
                        prop_assert!(self.cache.cached_blocks().is_empty());
                        return self.step(op);
                    }
                }
                let by_state = if order <= self.mm.config().max_order {
                    self.available_by_state(order)
                } else {
                    Vec::new()
                };
                let avail = if order <= self.mm.config().max_order {
                    self.available(order)
                } else {
                    vec![]
                };
                let total = self.pages.len() as u64;
                let hint = Pfn(u64::from(hint) % total.max(1));
                // The cache serves dirty requests of small orders from its own blocks of
                // exactly that order first, zone by zone.
                let cache_path = via_cache && !zeroed && order <= PCP_MAX_ORDER;
                let cached_blocks = self.cache.cached_blocks();
                let in_cache = |z: usize| {
                    let n = cached_blocks
                        .iter()
                        .filter(|(zz, b, _)| zz.0 == z && b.order == order)
                        .count();
                    if cache_path {
                        n as u64
                    } else {
                        0
                    }
                };
                let req = AllocRequest {
                    zeroed,
                    hint: Some(hint),
                };
                let res = if via_cache {
                    self.cache.alloc(order, req)
                } else {
                    self.mm.alloc(order, req)
                };
                match res {
                    Ok(a) => {
                        let b = a.block;
                        prop_assert!(b.is_aligned() && b.order == order);
                        for page in self.model(b) {
                            let ok = *page == Page::Free(a.prior)
                                || (cache_path && *page == Page::Cached(a.prior));
                            prop_assert!(
                                ok,
                                "{} prior state {:?} but model {:?}",
                                b,
                                a.prior,
                                page
                            );
                        }
                        // Zone fallback order, then the state preference inside the zone.
                        let first = (0..avail.len())
                            .position(|z| avail[z].0 + avail[z].1 + in_cache(z) > 0)
                            .unwrap();
                        prop_assert_eq!(a.zone, ZoneId(first));
                        if in_cache(first) > 0 {
                            prop_assert!(!a.prior.known_zero);
                        } else if cache_path {
                            // A refill takes a batch of dirty blocks (any residency) first.
                            let c = by_state[first];
                            prop_assert_eq!(a.prior.known_zero, c.dirty + c.reported_dirty == 0);
                        } else {
                            // Resident before reported; within each, known zero first for
                            // zero-requests and dirty first otherwise — except that reported
                            // blocks kept resident come before reported zero ones, which fault.
                            let c = by_state[first];
                            let resident =
                                self.mm.config().reported_not_zero == ReportedNotZero::Resident;
                            let order_of_states = if zeroed && resident {
                                [
                                    FreeState::ZERO,
                                    FreeState::DIRTY,
                                    FreeState::REPORTED_DIRTY,
                                    FreeState::REPORTED_ZERO,
                                ]
                            } else if zeroed {
                                [
                                    FreeState::ZERO,
                                    FreeState::DIRTY,
                                    FreeState::REPORTED_ZERO,
                                    FreeState::REPORTED_DIRTY,
                                ]
                            } else {
                                [
                                    FreeState::DIRTY,
                                    FreeState::ZERO,
                                    FreeState::REPORTED_DIRTY,
                                    FreeState::REPORTED_ZERO,
                                ]
                            };
                            let expected = order_of_states.into_iter().find(|&s| c.get(s) > 0);
                            prop_assert_eq!(Some(a.prior), expected);
                        }
                        let log = self.mem.take_log();
                        match a.zeroing {
                            Zeroing::NotRequested => prop_assert!(!zeroed && log.is_empty()),
                            Zeroing::Skipped => {
                                prop_assert!(zeroed && a.prior.known_zero && log.is_empty())
                            }
                            Zeroing::Done => {
                                prop_assert!(zeroed && !a.prior.known_zero);
                                prop_assert_eq!(log.len() as u64, order.pages());
                                if b.range().contains(hint) {
                                    prop_assert_eq!(log.last(), Some(&hint));
                                }
                            }
                        }
                        if zeroed {
                            prop_assert!(self.mem.reads_zero(b.range()));
                        }
                        self.set(b, Page::Allocated);
                        if scribble {
                            self.mem.scribble(b.range());
                        }
                        self.live.push(b);
                    }
                    Err(AllocError::OutOfMemory(_)) => {
                        prop_assert!(
                            (0..avail.len()).all(|z| avail[z].0 + avail[z].1 + in_cache(z) == 0)
                        );
                        self.unchanged_except_failures(&before)?;
                    }
                    Err(AllocError::OrderTooLarge { .. }) => {
                        prop_assert!(order > self.mm.config().max_order);
                        self.unchanged_except_failures(&before)?;
                    }
                    Err(e) => return Err(fail(&format!("unexpected {e}"))),
                }
            }
            Op::Free {
                via_cache,
                pick,
                known_zero,
            } => {
                if self.live.is_empty() {
                    return Ok(());
                }
                let i = pick as usize % self.live.len();
                let b = self.live[i];
                let hint = if known_zero {
                    FreeHint::KnownZero
                } else {
                    FreeHint::Dirty
                };
                let really_zero = self.mem.reads_zero(b.range());
                match self.free_via(via_cache, b, hint) {
                    Ok(()) => {
                        prop_assert!(!known_zero || really_zero);
                        self.live.swap_remove(i);
                        self.freed.push(b);
                        if via_cache && !known_zero && b.order <= PCP_MAX_ORDER {
                            // Into the cache (a drain, if any, is reconciled below).
                            self.set(b, Page::Cached(FreeState::DIRTY));
                        } else {
                            let state = if known_zero {
                                FreeState::ZERO
                            } else {
                                FreeState::DIRTY
                            };
                            self.set(b, Page::Free(state));
                            self.absorb_merge(b)?;
                        }
                    }
                    Err(FreeError::VerifyFailed(x)) => {
                        prop_assert!(known_zero && !really_zero && x == b);
                        self.unchanged(&before)?;
                    }
                    Err(e) => return Err(fail(&format!("unexpected {e}"))),
                }
            }
            Op::DoubleFree { via_cache, pick } => {
                if let Some(&b) = self.freed.get(pick as usize % self.freed.len().max(1)) {
                    // Unless the same block was handed out again since.
                    if !self.live.contains(&b) {
                        prop_assert!(self.free_via(via_cache, b, FreeHint::Dirty).is_err());
                        self.unchanged(&before)?;
                    }
                }
            }
            Op::Drain => self.cache.drain(),
            Op::BadFree {
                via_cache,
                pfn,
                order,
            } => {
                let b = Block::new(
                    Pfn(u64::from(pfn) % (self.pages.len() as u64 + 8)),
                    Order::new(order).unwrap(),
                );
                if !self.live.contains(&b) {
                    prop_assert!(self.free_via(via_cache, b, FreeHint::Dirty).is_err());
                    self.unchanged(&before)?;
                }
            }
            Op::WrongShape { pick, delta } => {
                if let Some(&b) = self.live.get(pick as usize % self.live.len().max(1)) {
                    let bad = [
                        Block::new(b.pfn, Order::new(b.order.get() + delta).unwrap()),
                        Block::new(Pfn(b.pfn.0 + u64::from(delta)), b.order),
                    ];
                    for x in bad {
                        if !self.live.contains(&x) {
                            prop_assert!(
                                self.mm.free(x, FreeHint::Dirty).is_err(),
                                "{} accepted",
                                x
                            );
                        }
                    }
                    self.unchanged(&before)?;
                }
            }
            Op::Isolate {
                zone,
                min_order,
                max_blocks,
                settle,
            } => {
                let zone = ZoneId(zone as usize % self.zones.len());
                let min = Order::new(min_order).unwrap();
                let max = Order::new(MAX_ORDER_LIMIT).unwrap();
                let got = if settle {
                    self.mm
                        .isolate_reported_not_zero(zone, min, max, max_blocks as usize)
                } else {
                    self.mm
                        .isolate_unreported(zone, min, max, max_blocks as usize)
                };
                prop_assert!(got.len() <= max_blocks as usize);
                for ib in &got {
                    let wanted = if settle {
                        ib.state == FreeState::REPORTED_DIRTY
                    } else {
                        !ib.state.reported
                    };
                    prop_assert!(ib.block.order >= min && wanted);
                    prop_assert!(self.zones[zone.0].contains_range(&ib.block.range()));
                    for page in self.model(ib.block) {
                        prop_assert_eq!(*page, Page::Free(ib.state));
                    }
                    self.set(ib.block, Page::Isolated(ib.state));
                    self.isolated.push(ib.block);
                }
                if got.len() < max_blocks as usize {
                    // Nothing unreported of a high enough order is left in that zone.
                    let info = self.mm.zone_info(zone).unwrap();
                    let left = |c: &FreeCounts| {
                        if settle {
                            c.reported_dirty
                        } else {
                            c.unreported()
                        }
                    };
                    prop_assert!(info.nr_free[min.index()..].iter().all(|c| left(c) == 0));
                }
            }
            Op::PutBack {
                pick,
                verdict,
                honest,
            } => {
                if self.isolated.is_empty() {
                    prop_assert!(self
                        .mm
                        .put_back(Block::new(Pfn(0), Order::ZERO), PutBack::Failed)
                        .is_err());
                    return self.unchanged(&before);
                }
                let i = pick as usize % self.isolated.len();
                let b = self.isolated.swap_remove(i);
                let Page::Isolated(old) = self.model(b)[0] else {
                    return Err(fail("not isolated"));
                };
                let verdict = [
                    PutBack::Reported(ZeroGuarantee::Zeroed),
                    PutBack::Reported(ZeroGuarantee::NotZeroed),
                    PutBack::Failed,
                ][verdict as usize];
                let lie = verdict == PutBack::Reported(ZeroGuarantee::Zeroed)
                    && !honest
                    && !self.mem.reads_zero(b.range());
                if verdict == PutBack::Reported(ZeroGuarantee::Zeroed) && honest {
                    // The host discarded the backing: the pages read zero now.
                    self.mem.zero(b.range(), None);
                    self.mem.take_log();
                }
                let res = self.mm.put_back(b, verdict);
                let state = match verdict {
                    _ if lie => {
                        prop_assert_eq!(res, Err(PutBackError::VerifyFailed(b)));
                        FreeState::REPORTED_DIRTY
                    }
                    PutBack::Reported(ZeroGuarantee::Zeroed) => FreeState::REPORTED_ZERO,
                    PutBack::Reported(ZeroGuarantee::NotZeroed) => FreeState {
                        known_zero: old.known_zero,
                        reported: true,
                    },
                    PutBack::Failed => old,
                };
                if !lie {
                    prop_assert_eq!(res, Ok(()));
                }
                // Putting it back twice is refused.
                prop_assert_eq!(
                    self.mm.put_back(b, verdict),
                    Err(PutBackError::NotIsolated(b))
                );
                self.set(b, Page::Free(state));
                self.absorb_merge(b)?;
            }
            Op::FreeIsolated { pick } => {
                if let Some(&b) = self
                    .isolated
                    .get(pick as usize % self.isolated.len().max(1))
                {
                    let res = self.mm.free(b, FreeHint::Dirty);
                    prop_assert!(matches!(res, Err(FreeError::Isolated { .. })), "{:?}", res);
                    self.unchanged(&before)?;
                }
            }
            Op::Mark { start, len, honest } => {
                let range = PageRange::new(
                    Pfn(u64::from(start) % self.pages.len() as u64),
                    u64::from(len),
                );
                let Some(zone) = self.zones.iter().find(|z| z.contains_range(&range)) else {
                    let res = self.mm.mark_known_zero(range);
                    prop_assert!(matches!(res, Err(MarkError::NotOwned(_))), "{:?}", res);
                    return self.unchanged(&before);
                };
                let _ = zone;
                // Free blocks entirely inside, not yet known zero: what the hint must mark.
                let mut targets = Vec::new();
                let mut p = range.start;
                while p < range.end() {
                    match self.mm.free_state_of(p) {
                        Some((b, s)) => {
                            if !s.known_zero && range.contains_range(&b.range()) {
                                targets.push(b);
                            }
                            p = b.range().end();
                        }
                        None => p = Pfn(p.0 + 1),
                    }
                }
                if honest {
                    for b in &targets {
                        self.mem.zero(b.range(), None);
                    }
                    self.mem.take_log();
                }
                let all_zero = targets.iter().all(|b| self.mem.reads_zero(b.range()));
                match self.mm.mark_known_zero(range) {
                    Ok(n) => {
                        prop_assert!(all_zero);
                        prop_assert_eq!(n, targets.iter().map(|b| b.order.pages()).sum::<u64>());
                        for b in targets {
                            let Page::Free(s) = self.model(b)[0] else {
                                return Err(fail("target not free"));
                            };
                            self.set(
                                b,
                                Page::Free(FreeState {
                                    known_zero: true,
                                    ..s
                                }),
                            );
                        }
                    }
                    Err(MarkError::VerifyFailed(_)) => {
                        prop_assert!(!all_zero);
                        self.unchanged_except_verify(&before)?;
                    }
                    Err(e) => return Err(fail(&format!("unexpected {e}"))),
                }
            }
        }
        Ok(())
    }
}
