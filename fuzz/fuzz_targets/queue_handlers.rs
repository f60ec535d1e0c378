//! Fuzzes the balloon device's queue handlers: arbitrary bytes drive a hostile driver
//! (descriptors, rings, buffers, config accesses) against the device on vm-memory guest
//! memory; `zeronce_balloon::fuzzing::run` panics when an invariant breaks.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    zeronce_balloon::fuzzing::run(data);
});
