//! Latency samples, percentiles over all of them, per-phase summaries and the per-second time
//! series. Pure functions: no clock, no IO.

use serde::Serialize;

/// What an actor did in one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Send,
    Poll,
}

/// One request: a send (until its acknowledgement) or a poll that returned messages.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub kind: Kind,
    /// When the request was issued, from the bench's common start instant.
    pub start_us: u64,
    pub latency_us: u64,
    pub messages: u64,
    pub payload_bytes: u64,
}

impl Sample {
    pub fn end_us(&self) -> u64 {
        self.start_us.saturating_add(self.latency_us)
    }
}

/// Nearest-rank percentile of an ascending slice: the smallest value such that at least `p`
/// percent of the samples are at or below it. `p` is clamped to 0..=100; 0 gives the minimum,
/// 100 the maximum; an empty slice gives 0.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 100.0) };
    // Less a hair, so that 99.9 % of 1000 is rank 999 despite binary floating point.
    let rank = (p / 100.0 * sorted.len() as f64 - 1e-9).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Latency percentiles over every sample of a phase, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Percentiles {
    pub samples: u64,
    pub min_us: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl Percentiles {
    /// `sorted` must be ascending.
    pub fn of_sorted(sorted: &[u64]) -> Percentiles {
        if sorted.is_empty() {
            return Percentiles::default();
        }
        let sum: u128 = sorted.iter().map(|&v| u128::from(v)).sum();
        Percentiles {
            samples: sorted.len() as u64,
            min_us: sorted[0],
            mean_us: sum as f64 / sorted.len() as f64,
            p50_us: percentile(sorted, 50.0),
            p90_us: percentile(sorted, 90.0),
            p99_us: percentile(sorted, 99.0),
            p999_us: percentile(sorted, 99.9),
            max_us: sorted[sorted.len() - 1],
        }
    }
}

/// One kind of traffic (all sends, or all polls) of a run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseSummary {
    pub kind: Kind,
    pub actors: usize,
    /// Requests that moved messages (sends, non-empty polls).
    pub requests: u64,
    /// Polls that returned nothing (consumers waiting for data); not latency samples.
    pub empty_polls: u64,
    pub messages: u64,
    pub payload_bytes: u64,
    /// From the first request's start to the last acknowledgement or reply.
    pub wall_seconds: f64,
    /// `payload_bytes / wall_seconds` (never a sum of per-actor rates).
    pub throughput_bytes_per_s: f64,
    pub throughput_mb_per_s: f64,
    pub messages_per_s: f64,
    pub latency: Percentiles,
    /// Sorted latencies (for the percentile chart; not serialized).
    #[serde(skip)]
    pub sorted_latencies_us: Vec<u64>,
}

/// Summarize the samples of one kind. `None` when there are none.
pub fn summarize(samples: &[Sample], kind: Kind, actors: usize, empty_polls: u64) -> Option<PhaseSummary> {
    let of_kind: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
    if of_kind.is_empty() {
        return None;
    }
    let first = of_kind.iter().map(|s| s.start_us).min().unwrap_or(0);
    let last = of_kind.iter().map(|s| s.end_us()).max().unwrap_or(0);
    let messages: u64 = of_kind.iter().map(|s| s.messages).sum();
    let payload_bytes: u64 = of_kind.iter().map(|s| s.payload_bytes).sum();
    // A run shorter than a microsecond cannot be timed: count it as one.
    let wall_seconds = (last.saturating_sub(first)).max(1) as f64 / 1e6;
    let mut sorted: Vec<u64> = of_kind.iter().map(|s| s.latency_us).collect();
    sorted.sort_unstable();
    let throughput = payload_bytes as f64 / wall_seconds;
    Some(PhaseSummary {
        kind,
        actors,
        requests: of_kind.len() as u64,
        empty_polls,
        messages,
        payload_bytes,
        wall_seconds,
        throughput_bytes_per_s: throughput,
        throughput_mb_per_s: throughput / 1e6,
        messages_per_s: messages as f64 / wall_seconds,
        latency: Percentiles::of_sorted(&sorted),
        sorted_latencies_us: sorted,
    })
}

/// One second of the run (by completion time) for one kind of traffic.
#[derive(Clone, Debug, Serialize)]
pub struct SecondBucket {
    pub kind: Kind,
    /// Seconds since the common start: this bucket covers `[second, second + 1)`.
    pub second: u64,
    pub requests: u64,
    pub messages: u64,
    pub payload_bytes: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// The per-second time series of each kind, ordered by kind then second. Seconds without any
/// completed request of a kind are present with zeros, so charts show stalls.
pub fn time_series(samples: &[Sample]) -> Vec<SecondBucket> {
    let mut out = Vec::new();
    for kind in [Kind::Send, Kind::Poll] {
        let of_kind: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        let Some(last) = of_kind.iter().map(|s| s.end_us() / 1_000_000).max() else {
            continue;
        };
        let first = of_kind.iter().map(|s| s.end_us() / 1_000_000).min().unwrap_or(0);
        let mut buckets: Vec<Vec<&Sample>> = vec![Vec::new(); (last - first + 1) as usize];
        for sample in &of_kind {
            buckets[(sample.end_us() / 1_000_000 - first) as usize].push(sample);
        }
        for (index, bucket) in buckets.iter().enumerate() {
            let mut latencies: Vec<u64> = bucket.iter().map(|s| s.latency_us).collect();
            latencies.sort_unstable();
            out.push(SecondBucket {
                kind,
                second: first + index as u64,
                requests: bucket.len() as u64,
                messages: bucket.iter().map(|s| s.messages).sum(),
                payload_bytes: bucket.iter().map(|s| s.payload_bytes).sum(),
                p50_us: percentile(&latencies, 50.0),
                p99_us: percentile(&latencies, 99.0),
                max_us: latencies.last().copied().unwrap_or(0),
            });
        }
    }
    out
}

/// Median of a list of figures (the mean of the middle two for an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let mid = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 90.0), 90);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 99.9), 100);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 50.0), 0);
        assert_eq!(percentile(&[7], 99.9), 7);
        // Out-of-range and NaN inputs are clamped, never out of bounds.
        assert_eq!(percentile(&v, 250.0), 100);
        assert_eq!(percentile(&v, -3.0), 1);
        assert_eq!(percentile(&v, f64::NAN), 1);
        // 1000 samples: p999 is the 999th value, not the maximum.
        let w: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&w, 99.9), 999);
        assert_eq!(percentile(&w, 50.0), 500);
    }

    #[test]
    fn percentiles_are_over_all_samples_and_ordered() {
        // Two actors with very different latencies: the percentiles come from the merged set,
        // not from averaging per-actor figures.
        let mut merged: Vec<u64> = (0..990).map(|_| 100).chain((0..10).map(|_| 10_000)).collect();
        merged.sort_unstable();
        let p = Percentiles::of_sorted(&merged);
        assert_eq!(p.p50_us, 100);
        assert_eq!(p.p99_us, 100);
        assert_eq!(p.p999_us, 10_000);
        assert_eq!(p.max_us, 10_000);
        assert!(p.min_us <= p.p50_us && p.p50_us <= p.p90_us && p.p90_us <= p.p99_us);
        assert!(p.p99_us <= p.p999_us && p.p999_us <= p.max_us);
    }

    #[test]
    fn throughput_is_total_bytes_over_wall_time() {
        // Two actors, each 1 MB in its own second, overlapping by half: wall time 1.5 s.
        let samples = [
            Sample {
                kind: Kind::Send,
                start_us: 0,
                latency_us: 1_000_000,
                messages: 10,
                payload_bytes: 1_000_000,
            },
            Sample {
                kind: Kind::Send,
                start_us: 500_000,
                latency_us: 1_000_000,
                messages: 10,
                payload_bytes: 1_000_000,
            },
        ];
        let s = summarize(&samples, Kind::Send, 2, 0).expect("summary");
        assert!((s.wall_seconds - 1.5).abs() < 1e-9);
        assert!((s.throughput_bytes_per_s - 2_000_000.0 / 1.5).abs() < 1e-6);
        assert_eq!(s.messages, 20);
        assert!(summarize(&samples, Kind::Poll, 0, 0).is_none());
    }

    #[test]
    fn time_series_has_every_second() {
        let samples = [
            Sample {
                kind: Kind::Send,
                start_us: 0,
                latency_us: 10,
                messages: 1,
                payload_bytes: 5,
            },
            Sample {
                kind: Kind::Send,
                start_us: 2_500_000,
                latency_us: 10,
                messages: 1,
                payload_bytes: 5,
            },
        ];
        let series = time_series(&samples);
        assert_eq!(series.iter().map(|b| b.second).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(series[1].requests, 0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
