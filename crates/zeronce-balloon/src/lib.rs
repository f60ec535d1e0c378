//! zeronce-balloon: the virtio-balloon device.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
