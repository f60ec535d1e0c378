//! Whether memory the host took back reads zero.

/// Whether a range of memory is guaranteed to read zero after the host (the kernel, or a
/// virtio-balloon device) took it back. The one answer to "did the host zero it", from a
/// discard operation up to the allocator's free-block state.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZeroGuarantee {
    /// The range now reads zero: its backing was discarded by an operation that refaults
    /// zero. A reported block goes back reported and known zero.
    Zeroed,
    /// No promise: the old contents may survive, and the memory may not have been
    /// returned (a lazy discard such as `MADV_FREE`, a hold not yet over, a host without
    /// zero hints). A reported block goes back reported, its known-zero state unchanged
    /// (old contents that survive were zero if the block was known zero).
    NotZeroed,
}

impl ZeroGuarantee {
    /// Whether the range is guaranteed to read zero.
    pub fn is_zeroed(self) -> bool {
        self == ZeroGuarantee::Zeroed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_zeroed_is_zeroed() {
        assert!(ZeroGuarantee::Zeroed.is_zeroed() && !ZeroGuarantee::NotZeroed.is_zeroed());
    }
}
