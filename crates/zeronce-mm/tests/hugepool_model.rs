//! Property test of the huge-page pool against a reference model: random sequences of
//! alloc / write / free / zeroer take+finish / misuse / clock ticks over fake memory.
//! Checked after every step: each page in exactly the model's state (so pages are
//! conserved and never in two states), zeroable counts exact, every page handed out or
//! kept as known zero really reads zero, allocation preference, counters, and the
//! notification rules (rate limit, no growth lost once the interval has passed).

mod common;

use common::FakeZeroer;
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zeronce_mm::hugepool::{
    HugePage, HugePool, HugePoolError, ManualClock, PageState, PoolZeroing, ZeroableEvent,
    ZeroingTicket,
};
use zeronce_mm::{FreeHint, Order, PageRange, Pfn, Zeroer, ZoneId};

const ORDER: u8 = 2;
const FRAMES: u64 = 1 << ORDER;
const INTERVAL: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
enum Op {
    Alloc { node: Option<u8>, zeroed: bool },
    Write(usize),
    Free { pick: usize, zero_hint: bool },
    DoubleFree(usize),
    FreeForeign,
    FreeWhileZeroing(usize),
    Take { node: u8, n: u64 },
    Finish { pick: usize, ok: bool },
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::option::of(0u8..4), any::<bool>()).prop_map(|(node, zeroed)| Op::Alloc { node, zeroed }),
        2 => any::<usize>().prop_map(Op::Write),
        4 => (any::<usize>(), any::<bool>()).prop_map(|(pick, zero_hint)| Op::Free { pick, zero_hint }),
        1 => any::<usize>().prop_map(Op::DoubleFree),
        1 => Just(Op::FreeForeign),
        1 => any::<usize>().prop_map(Op::FreeWhileZeroing),
        2 => (0u8..4, 0u64..4).prop_map(|(node, n)| Op::Take { node, n }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, ok)| Op::Finish { pick, ok }),
        2 => (0u64..25).prop_map(Op::Tick),
    ]
}

/// Model state of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum M {
    Free { known_zero: bool },
    InUse,
    Zeroing,
}

struct Harness {
    pool: HugePool,
    mem: FakeZeroer,
    clock: Arc<ManualClock>,
    events: Arc<Mutex<Vec<ZeroableEvent>>>,
    pages: Vec<HugePage>,
    model: Vec<M>,
    held: Vec<usize>,
    tickets: Vec<ZeroingTicket>,
    grew_since_event: [bool; 3],
    last_event: [Option<Duration>; 3],
    seen_events: usize,
    prezeroed: u64,
    inline: u64,
}

impl Harness {
    /// Three nodes of `sizes[i]` pages each, initially known zero or dirty.
    fn new(sizes: [(u64, bool); 3]) -> Harness {
        let order = Order::new(ORDER).unwrap();
        let total: u64 = sizes.iter().map(|s| s.0).sum();
        let mem = FakeZeroer::new(total * FRAMES + FRAMES, false);
        let mut pool = HugePool::new(order);
        let clock = ManualClock::new();
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&events);
        pool.set_event_hook(
            Box::new(move |e| sink.lock().unwrap().push(e)),
            clock.clone(),
            INTERVAL,
        );
        let (mut pages, mut model, mut start) = (Vec::new(), Vec::new(), 0);
        let mut grew = [false; 3];
        for (node, &(n, known_zero)) in sizes.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let range = PageRange::new(Pfn(start), n * FRAMES);
            if !known_zero {
                mem.scribble(range);
                grew[node] = true;
            }
            assert_eq!(pool.add_range(ZoneId(node), range, known_zero), Ok(n));
            for i in 0..n {
                pages.push(HugePage {
                    pfn: Pfn(start + i * FRAMES),
                    order,
                    node: ZoneId(node),
                });
                model.push(M::Free { known_zero });
            }
            start += n * FRAMES;
        }
        let mut h = Harness {
            pool,
            mem,
            clock,
            events,
            pages,
            model,
            held: Vec::new(),
            tickets: Vec::new(),
            grew_since_event: grew,
            last_event: [None; 3],
            seen_events: 0,
            prezeroed: 0,
            inline: 0,
        };
        h.check_events();
        h
    }

    fn index(&self, page: HugePage) -> usize {
        self.pages
            .iter()
            .position(|p| *p == page)
            .expect("a page of the pool")
    }

    fn zeroable(&self, node: usize) -> u64 {
        self.pages
            .iter()
            .zip(&self.model)
            .filter(|(p, m)| p.node == ZoneId(node) && **m == M::Free { known_zero: false })
            .count() as u64
    }

    fn set(&mut self, i: usize, state: M) {
        let node = self.pages[i].node.0;
        let before = self.zeroable(node);
        self.model[i] = state;
        if self.zeroable(node) > before {
            self.grew_since_event[node] = true;
        }
    }

    fn alloc(&mut self, node: Option<u8>, zeroed: bool) {
        let nodes: Vec<usize> = match node {
            Some(n) => vec![n as usize],
            None => vec![0, 1, 2],
        };
        let candidate = |kz: bool| {
            nodes.iter().any(|&n| {
                self.pages
                    .iter()
                    .zip(&self.model)
                    .any(|(p, m)| p.node == ZoneId(n) && *m == M::Free { known_zero: kz })
            })
        };
        let prefer = if zeroed { [true, false] } else { [false, true] };
        let expect = prefer.into_iter().find(|&kz| candidate(kz));
        match (
            self.pool.alloc(node.map(|n| ZoneId(n as usize)), zeroed),
            expect,
        ) {
            (Ok(a), Some(kz)) => {
                let i = self.index(a.page);
                assert_eq!(self.model[i], M::Free { known_zero: kz }, "preference");
                assert!(nodes.contains(&a.page.node.0));
                let want = match (zeroed, kz) {
                    (false, _) => PoolZeroing::NotRequested,
                    (true, true) => PoolZeroing::Skipped,
                    (true, false) => PoolZeroing::Required,
                };
                assert_eq!(a.zeroing, want);
                match a.zeroing {
                    PoolZeroing::Skipped => {
                        assert!(
                            self.mem.reads_zero(a.page.range()),
                            "handed out as zero, is not"
                        );
                        self.prezeroed += 1;
                    }
                    PoolZeroing::Required => {
                        self.mem.zero(a.page.range(), None);
                        self.inline += 1;
                    }
                    PoolZeroing::NotRequested => {}
                }
                self.set(i, M::InUse);
                self.held.push(i);
            }
            (Err(HugePoolError::Exhausted { zeroing, .. }), None) => {
                let model_zeroing = self
                    .pages
                    .iter()
                    .zip(&self.model)
                    .filter(|(p, m)| nodes.contains(&p.node.0) && **m == M::Zeroing)
                    .count();
                assert_eq!(zeroing, model_zeroing as u64);
            }
            (got, want) => panic!("alloc: got {got:?}, model expected known_zero={want:?}"),
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Alloc { node, zeroed } => self.alloc(node, zeroed),
            Op::Write(pick) if !self.held.is_empty() => {
                let i = self.held[pick % self.held.len()];
                self.mem.scribble(self.pages[i].range());
            }
            Op::Free { pick, zero_hint } if !self.held.is_empty() => {
                let i = self.held.swap_remove(pick % self.held.len());
                let hint = if zero_hint {
                    self.mem.zero(self.pages[i].range(), None);
                    FreeHint::KnownZero
                } else {
                    FreeHint::Dirty
                };
                self.pool.free(self.pages[i], hint).unwrap();
                self.set(
                    i,
                    M::Free {
                        known_zero: zero_hint,
                    },
                );
            }
            Op::DoubleFree(pick) => {
                let free: Vec<usize> = (0..self.model.len())
                    .filter(|&i| matches!(self.model[i], M::Free { .. }))
                    .collect();
                if !free.is_empty() {
                    let p = self.pages[free[pick % free.len()]];
                    assert_eq!(
                        self.pool.free(p, FreeHint::Dirty),
                        Err(HugePoolError::DoubleFree(p))
                    );
                }
            }
            Op::FreeForeign => {
                let p = HugePage {
                    pfn: Pfn(1 << 40),
                    ..self.pages[0]
                };
                assert_eq!(
                    self.pool.free(p, FreeHint::Dirty),
                    Err(HugePoolError::ForeignPage(p))
                );
            }
            Op::FreeWhileZeroing(pick) if !self.tickets.is_empty() => {
                let p = self.tickets[pick % self.tickets.len()].page();
                assert_eq!(
                    self.pool.free(p, FreeHint::Dirty),
                    Err(HugePoolError::BeingZeroed(p))
                );
            }
            Op::Take { node, n } => {
                let want = self.zeroable(node as usize).min(n);
                let got = self.pool.take_zeroable(ZoneId(node as usize), n);
                assert_eq!(got.len() as u64, want);
                for t in got {
                    let i = self.index(t.page());
                    assert_eq!(
                        self.model[i],
                        M::Free { known_zero: false },
                        "only zeroable pages"
                    );
                    self.set(i, M::Zeroing);
                    self.tickets.push(t);
                }
            }
            Op::Finish { pick, ok } if !self.tickets.is_empty() => {
                let t = self.tickets.swap_remove(pick % self.tickets.len());
                let i = self.index(t.page());
                if ok {
                    self.mem.zero(t.page().range(), None);
                }
                self.pool.finish_zeroing(t, ok).unwrap();
                self.set(i, M::Free { known_zero: ok });
            }
            Op::Tick(ms) => {
                self.clock.advance(Duration::from_millis(ms));
                let next = self.pool.poll_events();
                assert!(next.is_none_or(|t| t > self.pool.clock_now().unwrap()));
                self.check_events();
                let now = self.pool.clock_now().unwrap();
                for n in 0..3 {
                    let quiet = self.last_event[n].is_none_or(|t| now >= t + INTERVAL);
                    assert!(
                        !(quiet && self.grew_since_event[n] && self.zeroable(n) > 0),
                        "node {n}: zeroable grew and no event came after the interval"
                    );
                }
                return;
            }
            _ => {}
        }
        self.check_events();
    }

    /// New events: rate limit respected, counts current at firing.
    fn check_events(&mut self) {
        let events = self.events.lock().unwrap().clone();
        for e in &events[self.seen_events..] {
            let n = e.node.0;
            assert_eq!(
                e.zeroable,
                self.zeroable(n),
                "event carries the current count"
            );
            assert!(e.zeroable > 0);
            if let Some(last) = self.last_event[n] {
                assert!(
                    e.at >= last + INTERVAL,
                    "events {last:?} and {:?} too close",
                    e.at
                );
            }
            self.last_event[n] = Some(e.at);
            self.grew_since_event[n] = false;
        }
        self.seen_events = events.len();
    }

    fn check(&self) {
        self.pool.check_invariants().unwrap();
        for (i, p) in self.pages.iter().enumerate() {
            let state = match self.model[i] {
                M::Free { known_zero } => PageState::Free { known_zero },
                M::InUse => PageState::InUse,
                M::Zeroing => PageState::Zeroing,
            };
            assert_eq!(self.pool.state_of(p.pfn), Some((*p, state)));
            if self.model[i] == (M::Free { known_zero: true }) {
                assert!(
                    self.mem.reads_zero(p.range()),
                    "{p:?} kept as known zero, is not"
                );
            }
        }
        for n in 0..3 {
            assert_eq!(self.pool.zeroable(ZoneId(n)), self.zeroable(n));
        }
        assert_eq!(self.pool.counts().total(), self.pages.len() as u64);
        let k = self.pool.counters();
        assert_eq!(
            (k.allocs_prezeroed, k.allocs_zeroed_inline),
            (self.prezeroed, self.inline)
        );
        assert_eq!(k.events as usize, self.seen_events);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn pool_follows_the_model(
        sizes in [(0u64..5, any::<bool>()), (1u64..5, any::<bool>()), (0u64..5, any::<bool>())],
        ops in prop::collection::vec(op(), 1..80),
    ) {
        let mut h = Harness::new(sizes);
        h.check();
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }
}
