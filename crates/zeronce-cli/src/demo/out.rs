//! The demo's one renderer: each report of a step (`report`) as labelled lines of text
//! (or one JSON object with `--json`), memory held over time for `--plot`, and the
//! counters with names and units. Reports are shown as the steps make them, so the text
//! comes as the demo runs.

use super::report::{
    Allocator, Baseline, BaselineKind, DeviceCounters, Gauge, Intro, IntroMode, Level, Negotiated,
    Phase, ProcessCounters, Realloc, Sample, Settings, Settled,
};
use serde_json::{json, Map, Value};
use std::path::Path;
use std::time::{Duration, Instant};
use zeronce::zeronce_mm::reporting::ReportingStats;
use zeronce::zeronce_mm::Stats;
use zeronce_bench::plot::{self, Mark, Series};

/// A report the demo shows: its lines of text, its place in the JSON object, its points
/// in the plot.
pub trait Show {
    /// Shows it on `out`.
    fn show(&self, out: &mut Out);
}

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

    /// Shows `report`.
    pub fn show(&mut self, report: &impl Show) {
        report.show(self);
    }

    /// A line of text (not in JSON), with `key: value` in JSON.
    fn say(&mut self, text: &str, key: &str, value: Value) {
        self.line(text);
        self.fields.insert(key.into(), value);
    }

    /// A step: its line of text, or its JSON object.
    fn step(&mut self, text: &str, value: Value) {
        self.line(text);
        self.steps.push(value);
    }

    /// An explanation line (text only).
    fn explain(&self, text: &str) {
        self.line(&format!("   {text}"));
    }

    /// A line of text only.
    fn line(&self, text: &str) {
        if !self.json {
            println!("{text}");
        }
    }

    /// Records memory held (for the plot).
    fn sample(&mut self, s: Sample) {
        let at = s.at.saturating_duration_since(self.t0).as_secs_f64();
        self.resident.push((at, s.bytes as f64 / MIB));
    }

    /// Marks a moment in the plot.
    fn mark(&mut self, at: Instant, what: &str) {
        self.marks.push(Mark {
            at: at.saturating_duration_since(self.t0).as_secs_f64(),
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
            self.line(&format!("plot: {}", path.display()));
        }
        if self.json {
            self.fields.insert("steps".into(), Value::Array(self.steps));
            println!("{}", Value::Object(self.fields));
        }
        Ok(())
    }
}

fn mib(bytes: u64) -> u64 {
    bytes >> 20
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl Show for Sample {
    fn show(&self, out: &mut Out) {
        out.sample(*self);
    }
}

impl Show for Intro {
    fn show(&self, out: &mut Out) {
        let (size, backing, ws) = (self.size_mib, self.backing, self.working_set_mib);
        match &self.mode {
            IntroMode::Process => out.say(
                &format!(
                    "zeronce demo, process mode: {size} MiB of {backing} memory managed by \
                     zeronce, working set {ws} MiB in 2 MiB blocks",
                ),
                "mode",
                json!("process"),
            ),
            IntroMode::Vm { device_at } => out.say(
                &format!(
                    "zeronce demo, VM mode: {size} MiB of {backing} guest RAM, working set {ws} \
                     MiB in 2 MiB blocks; a virtio-balloon device {device_at}",
                ),
                "mode",
                json!("vm"),
            ),
        }
    }
}

impl Show for Negotiated {
    fn show(&self, out: &mut Out) {
        out.say(
            &format!(
                "   negotiated features: {}; reporting queue {}; rings at guest address {:#x} \
                 ({} KiB)",
                self.features.join(", "),
                self.reporting_queue,
                self.ring_gpa,
                self.ring_bytes >> 10
            ),
            "device",
            json!({ "features": self.features, "reporting_queue": self.reporting_queue,
                    "ring_gpa": self.ring_gpa, "ring_bytes": self.ring_bytes }),
        );
    }
}

impl Show for Settings {
    fn show(&self, out: &mut Out) {
        let c = &self.config;
        let budget = format!("{:?}", c.budget).to_lowercase();
        out.say(
            &format!(
                "   reporting: free blocks of {} KiB and up, {} ms after a free, {budget} budget; \
                 host policy {}; zero hints {}",
                c.order.bytes() >> 10,
                c.delay.as_millis(),
                self.host,
                if self.zero_hints { "on" } else { "off" }
            ),
            "settings",
            json!({
                "size_mib": self.size_mib, "working_set_mib": self.working_set_mib,
                "reporting_order": c.order.get(), "delay_ms": c.delay.as_millis() as u64,
                "budget": budget, "host_policy": self.host,
                "zero_hints": self.zero_hints,
            }),
        );
    }
}

impl Show for Level {
    fn show(&self, out: &mut Out) {
        self.plot(out);
        match self.gauge {
            Gauge::Memfd => self.memfd_line(out),
            Gauge::Resident => self.resident_line(out),
        }
    }
}

impl Level {
    /// The step's number, its words and its JSON name.
    fn label(&self) -> (u8, &'static str, &'static str) {
        let memfd = self.gauge == Gauge::Memfd;
        match self.phase {
            Phase::Start => (0, "start", "start"),
            Phase::Wrote => (1, "wrote the working set", "wrote"),
            Phase::Freed if memfd => (2, "freed it (not reported yet)", "freed"),
            Phase::Freed => (2, "freed it", "freed"),
            Phase::Reported { .. } if memfd => (3, "reported over the virtqueue", "reported"),
            Phase::Reported { .. } => (3, "background reporter ran", "reported"),
        }
    }

    /// The memory held (every sample taken while waiting for the reporter), and the
    /// free and the report as marks.
    fn plot(&self, out: &mut Out) {
        match &self.phase {
            Phase::Reported { settled, .. } => {
                settled.samples.iter().for_each(|&s| out.sample(s));
                out.mark(self.held.at, "reported");
            }
            Phase::Freed => {
                out.mark(self.held.at, "freed");
                out.sample(self.held);
            }
            Phase::Start | Phase::Wrote => out.sample(self.held),
        }
    }

    /// VM mode's line: the memfd's allocated MiB; after the report, how long it took.
    fn memfd_line(&self, out: &mut Out) {
        let (n, what, key) = self.label();
        let m = mib(self.held.bytes);
        out.step(
            &format!("{n}. {what:<31} memfd allocated {m:>6} MiB"),
            json!({ "step": key, "memfd_allocated_mib": m }),
        );
        if let Phase::Reported { settled, .. } = &self.phase {
            out.explain(&format!(
                "({}; a pass runs {:.1} s after the first request since the last pass: the \
                 free, or the one made at start-up; seen by polling every 0.1 s)",
                describe(settled, self.delay),
                self.delay.as_secs_f64()
            ));
        }
    }

    /// Process mode's line: resident MiB, and what the reporter is doing.
    fn resident_line(&self, out: &mut Out) {
        let (n, what, key) = self.label();
        let m = mib(self.held.bytes);
        let delay = self.delay.as_secs_f64();
        match &self.phase {
            Phase::Reported { settled, hold } => {
                out.step(
                    &format!(
                        "{n}. {what:<30} resident {m:>6} MiB, {} (a pass runs {delay:.1} s after \
                         the first request since the last pass: the free, or the one made at \
                         start-up as Linux does at registration; seen by polling every 0.1 s)",
                        describe(settled, self.delay),
                    ),
                    json!({ "step": key, "resident_mib": m,
                            "seconds_after_free": settled.after.as_secs_f64(),
                            "passes": settled.passes }),
                );
                if let Some(hold) = hold {
                    out.explain(&format!(
                        "(host policy hold: reported memory stays resident for {:.1} s before it \
                         is discarded, and reads zero only from then on)",
                        hold.as_secs_f64()
                    ));
                }
            }
            phase => {
                let tail = match phase {
                    Phase::Freed => format!(
                        " (free in the allocator, not yet given back: the next reporting pass \
                         is due within about {delay:.1} s, as a pass comes {delay:.1} s after \
                         the first request since the last pass, which may predate this free)"
                    ),
                    _ => String::new(),
                };
                out.step(
                    &format!("{n}. {what:<30} resident {m:>6} MiB{tail}"),
                    json!({ "step": key, "resident_mib": m }),
                );
            }
        }
    }
}

/// "N s after the free, in N pass(es)", and why it took more than one.
fn describe(settled: &Settled, delay: Duration) -> String {
    let more = if settled.passes > 1 {
        format!(
            "; a pass that spends its budget (Linux's: about 1/16 of each free list; the \
             adaptive one's too when blocks were allocated during the delay before it) \
             resumes {:.1} s later",
            delay.as_secs_f64()
        )
    } else {
        String::new()
    };
    format!(
        "{:.1} s after the free, in {} pass{}{more}",
        settled.after.as_secs_f64(),
        settled.passes,
        if settled.passes == 1 { "" } else { "es" }
    )
}

impl Show for Realloc {
    fn show(&self, out: &mut Out) {
        let t = self.timing;
        out.step(
            &format!(
                "4. allocated {} MiB zeroed ({} blocks): {} of step 1's blocks known zero from \
                 the host (reported, answered \"zero\"), {} never written since mapped (read \
                 zero){}, {} zeroed by the allocator: alloc {:.2} ms, first touch {:.2} ms",
                self.mib,
                self.blocks,
                self.by_host,
                self.fresh,
                if self.ahead > 0 {
                    format!(", {} zeroed ahead of time", self.ahead)
                } else {
                    String::new()
                },
                self.zeroed,
                ms(t.alloc),
                ms(t.touch)
            ),
            json!({ "step": "allocated_zeroed", "blocks": self.blocks,
                    "blocks_known_zero": self.known_zero,
                    "blocks_known_zero_from_host": self.by_host,
                    "blocks_never_written": self.fresh,
                    "blocks_zeroed_ahead_of_time": self.ahead,
                    "blocks_zeroed_by_allocator": self.zeroed,
                    "alloc_ms": ms(t.alloc), "first_touch_ms": ms(t.touch) }),
        );
        if self.by_host == 0 && !self.why_not_host.is_empty() {
            out.explain(&format!("(none from the host: {})", self.why_not_host));
        }
    }
}

impl Show for Baseline {
    fn show(&self, out: &mut Out) {
        let (zeroed, t) = (self.zeroed_mib, self.timing);
        match self.kind {
            BaselineKind::NeverLeft { resident_mib, ours } => {
                out.step(
                    &format!(
                        "5. same on memory that never left (reporting off): the allocator zeroed \
                         {zeroed} MiB: alloc {:.2} ms, first touch {:.2} ms, resident \
                         {resident_mib} MiB",
                        ms(t.alloc),
                        ms(t.touch),
                    ),
                    json!({ "step": "baseline_never_left", "allocator_zeroed_mib": zeroed,
                            "alloc_ms": ms(t.alloc), "first_touch_ms": ms(t.touch) }),
                );
                if ours.touch > t.touch {
                    out.explain(
                        "step 4's first touch costs more than step 5's: that memory was not \
                         resident (given back to the host, or never touched), so touching it \
                         faults every page in and the kernel zeroes it. Giving memory back \
                         costs that refault, not the zeroing zeronce skipped; pre-zeroed huge \
                         pages (bench prezero) and keeping reported memory for a while (--host \
                         hold) address it.",
                    );
                }
            }
            BaselineKind::NoZeroPromise => out.step(
                &format!(
                    "5. same with a device that makes no zero promise (bit 6 off), reported by a \
                     flush: the allocator zeroed {zeroed} MiB again: alloc {:.2} ms, first touch \
                     {:.2} ms",
                    ms(t.alloc),
                    ms(t.touch)
                ),
                json!({ "step": "baseline_no_zero_promise", "allocator_zeroed_mib": zeroed,
                        "alloc_ms": ms(t.alloc), "first_touch_ms": ms(t.touch) }),
            ),
        }
    }
}

impl Show for ProcessCounters {
    fn show(&self, out: &mut Out) {
        out.line("counters (zeronce's memory, as of step 4):");
        allocator(out, &self.mm);
        if let Some(r) = &self.reporting {
            reporting(out, r);
        }
        if let Some(d) = &self.host {
            out.say(
                &format!(
                    "   host (this process's kernel): {} MiB discarded, {} MiB answered \"now \
                     zero\", {} MiB held now (reported, not yet discarded), {} failed discards",
                    mib(d.discarded),
                    mib(d.answered_zero),
                    mib(d.held),
                    d.failed
                ),
                "host",
                json!({ "discarded_bytes": d.discarded, "answered_zero_bytes": d.answered_zero,
                        "held_bytes": d.held, "failed_discards": d.failed }),
            );
        }
    }
}

impl Show for Allocator {
    fn show(&self, out: &mut Out) {
        allocator(out, &self.0);
    }
}

impl Show for DeviceCounters {
    fn show(&self, out: &mut Out) {
        let d = &self.device;
        let n = |v: Option<u64>| v.unwrap_or(0);
        let s = &self.driver;
        out.say(
            &format!(
                "   {}, since it started{}: {} pages reported, {} MiB discarded, {} blocks \
                 promised zero, {} failed discards, {} malformed requests; driver: {} report \
                 calls, answers {} blocks zero / {} not zero, {} failures",
                self.label,
                if self.served {
                    " (its control socket)"
                } else {
                    ""
                },
                n(d.pages_reported),
                n(d.bytes_discarded) >> 20,
                n(d.zero_promises),
                n(d.failed_discards),
                n(d.malformed),
                s.reports,
                s.zeroed,
                s.not_zeroed,
                s.failures
            ),
            self.key,
            json!({
                "device": {
                    "pages_reported": d.pages_reported, "bytes_discarded": d.bytes_discarded,
                    "zero_promises": d.zero_promises, "failed_discards": d.failed_discards,
                    "malformed_requests": d.malformed,
                },
                "driver_report_calls": s.reports,
                "driver_answered_zeroed": s.zeroed,
                "driver_answered_not_zeroed": s.not_zeroed,
                "driver_failures": s.failures,
                "reported_beyond_working_set_bytes": self.beyond,
            }),
        );
        if self.beyond > 0 {
            out.explain(&format!(
                "({} MiB more than the {} MiB working set: {})",
                mib(self.beyond),
                mib(self.working_set),
                self.beyond_why
            ));
        }
    }
}

/// The allocator's zeroing counters, labelled.
fn allocator(out: &mut Out, mm: &Stats) {
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
fn reporting(out: &mut Out, r: &ReportingStats) {
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
