//! Progress of long runs on stderr (`indicatif`): drawn only when stderr is a terminal,
//! so `--json` output piped to a file or a pipe stays clean and logs stay readable.

use crate::common::Common;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar over `total` steps (repetitions, rounds, runs).
pub struct Progress(ProgressBar);

impl Progress {
    /// A bar labelled `label`; hidden when stderr is not a terminal.
    pub fn new(_common: Common, label: &str, total: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
        {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_message(label.to_string());
        Progress(bar)
    }

    /// One step done.
    pub fn inc(&self) {
        self.0.inc(1);
    }

    /// Removes the bar.
    pub fn finish(&self) {
        self.0.finish_and_clear();
    }
}
