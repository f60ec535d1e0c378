//! Who zeroes process memory and what is known zero per chunk: the [`RamZeroer`] the
//! manager calls, the chunk states of [`zeromap`] (with a bit per page written since its last zeroing) and the [`background`] zeroer threads of
//! the zero-once lifecycle. Used by the manager core (`managed`) and by process mode.

pub(crate) mod background;
mod written;
mod zeroer;
pub(crate) mod zeromap;

pub use background::ZeroerConfig;
pub use zeroer::RamZeroer;
pub use zeromap::ZeroingStats;
