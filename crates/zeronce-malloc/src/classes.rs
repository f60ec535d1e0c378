//! The size classes of the thread caches (`ffi/cache.rs`): which freed small blocks a
//! thread keeps, and for which requests.
//!
//! The classes are mimalloc's own block sizes up to [`CACHED_MAX`]: every 16 bytes up to
//! 128, then four a doubling (160, 192, 224, 256, 320, …, 1024). A request takes the
//! smallest class that holds it, so a cached block serves exactly the requests mimalloc
//! would have served from the same size of block. A freed block is kept only when its
//! usable size *is* a class size: the usual case, since mimalloc hands out blocks of these
//! sizes; a block of any other size (an aligned block's pointer inside its block, a
//! mimalloc built with other sizes) goes straight back to mimalloc. So a cached block always
//! holds at least what the request asked for, whatever mimalloc does.

/// The largest request a thread cache serves (bytes).
pub const CACHED_MAX: usize = 1024;

/// How many classes there are.
pub const CLASSES: usize = 20;

/// Below this size the classes are 16 bytes apart.
const LINEAR_MAX: usize = 128;

/// Blocks of one class a thread keeps at most; past it, a [`BATCH`] of them goes to the
/// transfer cache. Fewer for the larger classes (a bound in bytes) made the batches of
/// those classes smaller, and the small-objects benchmark's producer/consumer pairs slower
/// by 15–25 %.
pub const KEPT: usize = 64;

/// Blocks a thread hands to the transfer cache, or takes from it, at once: half of
/// [`KEPT`], so that a thread that only frees, or only allocates, passes through the
/// transfer cache's lock once a batch.
pub const BATCH: usize = KEPT / 2;

/// A size class (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Class(usize);

impl Class {
    /// The class serving a request of `size` bytes, 1 ..= [`CACHED_MAX`]: the smallest
    /// whose blocks hold it.
    #[inline(always)]
    pub fn of_request(size: usize) -> Class {
        debug_assert!((1..=CACHED_MAX).contains(&size));
        if size <= LINEAR_MAX {
            return Class((size - 1) / 16);
        }
        // Past 128: four classes between each power of two and the next, picked by the
        // two bits below the highest of `size - 1`.
        let w = size - 1;
        let top = (usize::BITS - 1 - w.leading_zeros()) as usize;
        Class(8 + (top - 7) * 4 + ((w >> (top - 2)) & 3))
    }

    /// The class whose blocks are exactly `usable` bytes, if there is one.
    #[inline(always)]
    pub fn of_block(usable: usize) -> Option<Class> {
        if usable == 0 || usable > CACHED_MAX {
            return None;
        }
        let class = Class::of_request(usable);
        (class.size() == usable).then_some(class)
    }

    /// The class's block size.
    pub const fn size(self) -> usize {
        if self.0 < 8 {
            16 * (self.0 + 1)
        } else {
            let past = self.0 - 8;
            let top = 7 + past / 4;
            (1 << top) + ((past % 4 + 1) << (top - 2))
        }
    }

    /// The class's place in per-class tables, 0 .. [`CLASSES`].
    #[inline(always)]
    pub const fn index(self) -> usize {
        self.0
    }

    /// Every class, smallest first.
    pub fn all() -> impl Iterator<Item = Class> {
        (0..CLASSES).map(Class)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_request_takes_the_smallest_class_that_holds_it() {
        for size in 1..=CACHED_MAX {
            let class = Class::of_request(size);
            assert!(class.index() < CLASSES, "{size}: {class:?}");
            assert!(class.size() >= size, "{size} in {}", class.size());
            if class.index() > 0 {
                let below = Class(class.index() - 1);
                assert!(below.size() < size, "{size}: {} holds it", below.size());
            }
        }
    }

    #[test]
    fn the_sizes_are_mimallocs_and_grow() {
        let sizes: Vec<usize> = Class::all().map(Class::size).collect();
        assert_eq!(
            sizes,
            [
                16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768,
                896, 1024
            ]
        );
        assert_eq!(Class::of_request(CACHED_MAX).index(), CLASSES - 1);
    }

    #[test]
    fn a_block_is_kept_only_at_a_class_size() {
        for usable in 0..=2 * CACHED_MAX {
            match Class::of_block(usable) {
                Some(class) => assert_eq!(class.size(), usable),
                None => assert!(Class::all().all(|c| c.size() != usable), "{usable}"),
            }
        }
    }

    #[test]
    fn limits_bound_a_threads_cache_and_batches_move_some() {
        const {
            assert!(BATCH >= 16);
            assert!(BATCH < KEPT);
            assert!(KEPT <= 64);
        }
        let bytes: usize = Class::all().map(|class| KEPT * class.size()).sum();
        // What a thread keeps at most, all classes full: 400 KiB (glibc's tcache, seven
        // blocks a size up to 1032 bytes: about 230 KiB).
        assert!(bytes <= 400 << 10, "{bytes}");
    }
}
