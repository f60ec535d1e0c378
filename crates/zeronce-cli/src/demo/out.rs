//! What the demo shows: steps as labelled lines (or one JSON object with `--json`),
//! resident memory over time for `--plot`, and the counters with names and units.

use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::Instant;
use zeronce::zeronce_mm::reporting::ReportingStats;
use zeronce::zeronce_mm::Stats;
use zeronce_bench::plot::{self, Mark, Series};

/// Collects the demo's output.
pub struct Out {
    json: bool,
    t0: Instant,
    fields: Map<String, Value>,
    steps: Vec<Value>,
    resident: Vec<(f64, f64)>,
    marks: Vec<Mark>,
}

const MIB: f64 = (1u64 << 20) as f64;

impl Out {
    /// Text on stdout, or JSON when `json`.
    pub fn new(json: bool) -> Out {
        Out {
            json,
            t0: Instant::now(),
            fields: Map::new(),
            steps: Vec::new(),
            resident: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// A line of text (not in JSON), with `key: value` in JSON.
    pub fn say(&mut self, text: &str, key: &str, value: Value) {
        if !self.json {
            println!("{text}");
        }
        self.fields.insert(key.into(), value);
    }

    /// A step: its line of text, or its JSON object.
    pub fn step(&mut self, text: String, value: Value) {
        if !self.json {
            println!("{text}");
        }
        self.steps.push(value);
    }

    /// An explanation line (text only).
    pub fn explain(&self, text: &str) {
        if !self.json {
            println!("   {text}");
        }
    }

    /// Records resident bytes now (for the plot).
    pub fn sample(&mut self, resident_bytes: u64) {
        self.resident
            .push((self.t0.elapsed().as_secs_f64(), resident_bytes as f64 / MIB));
    }

    /// Marks this moment in the plot.
    pub fn mark(&mut self, what: &str) {
        self.marks.push(Mark {
            at: self.t0.elapsed().as_secs_f64(),
            what: what.into(),
        });
    }

    /// Prints the JSON object (with `--json`) and draws the plot (with `plot`).
    pub fn finish(
        mut self,
        plot: Option<&Path>,
        title: &str,
    ) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(path) = plot {
            let series = [Series {
                name: "resident (zeronce, reporting on)".into(),
                points: std::mem::take(&mut self.resident),
            }];
            plot::resident_over_time(path, title, &series, &self.marks)?;
            if !self.json {
                println!("plot: {}", path.display());
            }
        }
        if self.json {
            self.fields.insert("steps".into(), Value::Array(self.steps));
            println!("{}", Value::Object(self.fields));
        }
        Ok(())
    }
}

/// The allocator's zeroing counters, labelled.
pub fn allocator(out: &mut Out, mm: &Stats) {
    out.say(
        &format!(
            "   allocator: zeroed {} MiB, zeroing skipped {} MiB (known zero), {} zero-requests \
             served without zeroing",
            mm.bytes_zeroed >> 20,
            mm.bytes_zeroing_skipped >> 20,
            mm.zero_requests_skipped
        ),
        "allocator",
        json!({
            "zeroed_bytes": mm.bytes_zeroed,
            "zeroing_skipped_bytes": mm.bytes_zeroing_skipped,
            "zero_requests_served_without_zeroing": mm.zero_requests_skipped,
        }),
    );
}

/// The reporting engine's counters, labelled. Each block is counted once, when it was
/// reported; a held block offered again when its hold ended (a settle pass) is counted
/// apart.
pub fn reporting(out: &mut Out, r: &ReportingStats) {
    let t = &r.total;
    let (blocks, pages) = (t.blocks - r.settled.blocks, t.pages - r.settled.pages);
    let zero = t.zeroed_pages - r.settled.zeroed_pages;
    let mut text = format!(
        "   reporting: scheduled passes {}, flushes {}, report calls {}, blocks reported {blocks} \
         ({} MiB; free neighbours merge, so a block can be larger than one allocation), \
         answered zero at once {} MiB, failed calls {}, budget stops {}, zones gated by the \
         watermark {}",
        r.passes,
        r.flushes,
        t.calls - r.settled.calls,
        pages >> 8,
        zero >> 8,
        t.errors,
        t.budget_stops,
        t.gated_zones
    );
    if r.settles > 0 {
        text.push_str(&format!(
            "; {} settle passes offered {} MiB of held blocks again, {} MiB of it answered zero \
             then",
            r.settles,
            r.settled.pages >> 8,
            r.settled.zeroed_pages >> 8
        ));
    }
    out.say(
        &text,
        "reporting",
        json!({
            "passes": r.passes, "flushes": r.flushes, "settles": r.settles,
            "report_calls": t.calls - r.settled.calls, "blocks_reported": blocks,
            "pages_reported": pages, "pages_promised_zero": zero,
            "settle_calls": r.settled.calls, "pages_settled": r.settled.pages,
            "pages_promised_zero_at_settle": r.settled.zeroed_pages,
            "failed_calls": t.errors, "budget_stops": t.budget_stops,
            "zones_gated": t.gated_zones, "put_back_errors": t.put_back_errors,
        }),
    );
}
