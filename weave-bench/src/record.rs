//! One size of a benchmark run, as the JSON line both bench programs print: `bench-worker`
//! (weave) writes it with [`SizeResult::to_line`], `mpi_bench.c` (Open MPI) writes the same
//! keys, and the driver reads both with [`SizeResult::parse`].
//!
//! A line: `{"op":…,"bytes":…,"count":…,"dtype":…,"redop":…,"inplace":…,"ranks":…,
//! "time_us":…,"algbw":…,"busbw":…,"wrong":…,"algorithm":…,"shared_cpu":…,"create_s":…}`
//! (GB/s = 1e9 B/s; `wrong` is `null` when not checked; `redop` is `none` for collectives that
//! do not reduce; `shared_cpu` and `create_s` may be missing; `nodes` only from the baseline).

use collectives::Collective;
use serde::{Deserialize, Serialize};

/// Whether the benchmark runs `collective`: every one of [`Collective::ALL`] with equal blocks
/// (not all-to-all-v nor point-to-point).
pub fn benched(collective: Collective) -> bool {
    !matches!(collective, Collective::AllToAllv | Collective::SendRecv)
}

/// A collective the benchmark runs, by any name [`Collective::parse`] takes (`all_reduce`,
/// `all-reduce`, `allreduce`); an error names the ones it knows.
pub fn benched_collective(name: &str) -> Result<Collective, String> {
    Collective::parse(name).filter(|&c| benched(c)).ok_or_else(|| {
        let known: Vec<&str> = Collective::ALL.into_iter().filter(|&c| benched(c)).map(Collective::name).collect();
        format!("unknown collective {name:?}; expected one of {}", known.join(", "))
    })
}

/// Whether `collective` takes a reduction operator.
pub fn reduces(collective: Collective) -> bool {
    matches!(collective, Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce)
}

/// nccl-tests' bus-bandwidth factor for `ranks` ranks: all-reduce 2(n-1)/n; all-gather,
/// reduce-scatter, all-to-all (n-1)/n; broadcast, reduce 1.
pub fn bus_factor(collective: Collective, ranks: u64) -> f64 {
    let n = ranks.max(1) as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll | Collective::AllToAllv => {
            (n - 1.0) / n
        }
        Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
    }
}

/// Algorithm bandwidth in GB/s (1e9 bytes per second) of `bytes` moved in `time_us`.
pub fn algbw(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 { bytes as f64 / 1e3 / time_us } else { 0.0 }
}

/// The sizes of a sweep: `min`, `min × factor`, … while not above `max` (nccl-tests' `-b`,
/// `-e`, `-f`).
pub fn sweep_sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let mut v = Vec::new();
    let mut s = min;
    while s <= max {
        v.push(s);
        match s.checked_mul(factor) {
            Some(next) if next > s => s = next,
            _ => break,
        }
    }
    v
}

/// One size of a run: one JSON line of a bench program.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SizeResult {
    /// The collective.
    #[serde(with = "collective_name")]
    pub op: Collective,
    /// Bytes of the largest buffer (all-gather: the receive buffer; reduce-scatter: the send
    /// buffer).
    pub bytes: u64,
    /// Elements per rank (per block for the block collectives).
    pub count: u64,
    /// nccl-tests' name of the element type (`float`).
    pub dtype: String,
    /// Reduction operator name (`none` where the collective does not reduce).
    pub redop: String,
    /// In place or not.
    pub inplace: bool,
    /// Number of ranks.
    pub ranks: u64,
    /// Median over the timed calls of the slowest rank's time, in microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s: as printed; [`SizeResult::parse`] checks it against `bytes`
    /// and `time_us`.
    pub algbw: f64,
    /// Bus bandwidth, GB/s: `algbw` × [`bus_factor`].
    pub busbw: f64,
    /// Wrong elements over all ranks and calls; `None` when not checked.
    pub wrong: Option<u64>,
    /// The algorithm that ran (`mpi` for the baseline).
    pub algorithm: String,
    /// At the end of the size, two ranks were on one CPU (their waits then went through the
    /// scheduler). False when the line does not say.
    #[serde(default)]
    pub shared_cpu: bool,
    /// Seconds the slowest rank took to create the communicator (weave) or initialize MPI,
    /// when the line says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_s: Option<f64>,
    /// How many distinct hosts the ranks ran on, when the line says (the Open MPI baseline's
    /// do: it is checked against the nodes it was asked to use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u64>,
}

impl SizeResult {
    /// A result with its bandwidths computed from `bytes` and `time_us`; the other fields
    /// have their "not said" values (`wrong` unchecked, no CPU shared, no creation time or
    /// node count) for the caller to fill in.
    pub fn new(op: Collective, bytes: u64, count: u64, ranks: u64, time_us: f64) -> SizeResult {
        let algbw = algbw(bytes, time_us);
        SizeResult {
            op,
            bytes,
            count,
            dtype: String::new(),
            redop: String::new(),
            inplace: false,
            ranks,
            time_us,
            algbw,
            busbw: algbw * bus_factor(op, ranks),
            wrong: None,
            algorithm: String::new(),
            shared_cpu: false,
            create_s: None,
            nodes: None,
        }
    }

    /// Parses one JSON line. The bandwidths it carries must agree with its bytes and time, and
    /// `wrong` must be present (`null` when not checked).
    pub fn parse(line: &str) -> Result<SizeResult, String> {
        let value: serde_json::Value = serde_json::from_str(line).map_err(|e| e.to_string())?;
        if value.get("wrong").is_none() {
            return Err("missing \"wrong\"".into());
        }
        let r: SizeResult = serde_json::from_value(value).map_err(|e| e.to_string())?;
        if r.time_us < 0.0 {
            return Err(format!("negative time {}", r.time_us));
        }
        let want = SizeResult::new(r.op, r.bytes, r.count, r.ranks, r.time_us);
        for (key, got, want) in [("algbw", r.algbw, want.algbw), ("busbw", r.busbw, want.busbw)] {
            if (got - want).abs() > 1e-6 * want.abs().max(1e-9) {
                return Err(format!("{key} {got} does not match bytes / time ({want})"));
            }
        }
        Ok(r)
    }

    /// The line [`SizeResult::parse`] reads (non-finite numbers become `null`, which it
    /// refuses).
    pub fn to_line(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

/// A [`Collective`] as its snake-case name.
mod collective_name {
    use collectives::Collective;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(c: &Collective, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(c.name())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Collective, D::Error> {
        let name = String::deserialize(d)?;
        Collective::parse(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown op {name:?}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(op: &str, bytes: u64, ranks: u64, time_us: f64, wrong: &str) -> String {
        let ab = algbw(bytes, time_us);
        let bb = ab * Collective::parse(op).map_or(1.0, |o| bus_factor(o, ranks));
        format!(
            r#"{{"op":"{op}","bytes":{bytes},"count":{},"dtype":"float","redop":"sum","inplace":false,"ranks":{ranks},"time_us":{time_us},"algbw":{ab},"busbw":{bb},"wrong":{wrong},"algorithm":"one_shot"}}"#,
            bytes / 4
        )
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(bus_factor(Collective::AllReduce, 2), 1.0);
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllReduce, 8), 1.75);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::ReduceScatter, 2), 0.5);
        assert_eq!(bus_factor(Collective::AllToAll, 8), 0.875);
        assert_eq!(bus_factor(Collective::Broadcast, 8), 1.0);
        assert_eq!(bus_factor(Collective::Reduce, 3), 1.0);
        assert_eq!(bus_factor(Collective::AllReduce, 1), 0.0);
        assert_eq!(benched_collective("AllReduce"), Ok(Collective::AllReduce));
        assert_eq!(benched_collective("all-to-all"), Ok(Collective::AllToAll));
        assert!(benched_collective("gather").unwrap_err().contains("expected one of all_reduce"));
        assert!(benched_collective("send_recv").is_err());
        // 1 MB in 1000 us is 1 GB/s.
        assert_eq!(algbw(1_000_000, 1000.0), 1.0);
        assert_eq!(algbw(8, 0.0), 0.0);
        assert_eq!(sweep_sizes(8, 64 << 20, 2).len(), 24);
        assert_eq!(sweep_sizes(1024, 1 << 20, 4), [1024, 4096, 16384, 65536, 262144, 1048576]);
        assert_eq!(sweep_sizes(u64::MAX, u64::MAX, 2), [u64::MAX]);
    }

    #[test]
    fn parses_result_lines() {
        let r = SizeResult::parse(&line("all_reduce", 1 << 20, 4, 100.0, "0")).unwrap();
        assert_eq!((r.op, r.bytes, r.count, r.ranks, r.wrong), (Collective::AllReduce, 1 << 20, 1 << 18, 4, Some(0)));
        assert!((r.busbw - 1.5 * 10.48576).abs() < 1e-9);
        let r = SizeResult::parse(&line("all_gather", 64, 2, 3.5, "null")).unwrap();
        assert_eq!(r.wrong, None);
        // Bandwidths that do not match bytes and time, bad types, and garbage are errors.
        let bad_bw = line("all_reduce", 1024, 2, 1.0, "0").replace("\"busbw\":", "\"busbw\":9");
        assert!(SizeResult::parse(&bad_bw).unwrap_err().contains("busbw"));
        assert!(SizeResult::parse(&line("gather", 8, 2, 1.0, "0")).unwrap_err().contains("unknown op"));
        assert!(SizeResult::parse(&line("all_reduce", 8, 2, 1.0, "-1")).is_err());
        assert!(SizeResult::parse(&line("all_reduce", 8, 2, 1.0, "\"x\"")).is_err());
        assert!(SizeResult::parse(&line("all_reduce", 8, 2, -1.0, "0")).unwrap_err().contains("negative"));
        assert!(SizeResult::parse(&line("all_reduce", 8, 2, 1.0, "0").replace(",\"wrong\":0", "")).is_err());
        assert!(SizeResult::parse("{\"op\":\"all_reduce\"}").unwrap_err().contains("missing"));
        assert!(SizeResult::parse("not json").is_err());
    }

    #[test]
    fn a_written_line_reads_back() {
        let mut r = SizeResult::new(Collective::ReduceScatter, 4096, 256, 4, 12.5);
        r.dtype = "float".into();
        r.redop = "sum".into();
        r.wrong = Some(0);
        r.algorithm = "ring \"quoted\"".into();
        r.create_s = Some(0.25);
        let text = r.to_line();
        assert!(text.starts_with(r#"{"op":"reduce_scatter","bytes":4096,"count":256,"dtype":"float""#), "{text}");
        assert!(!text.contains("nodes"), "unsaid fields stay out: {text}");
        assert_eq!(SizeResult::parse(&text), Ok(r.clone()));
        r.time_us = f64::NAN;
        assert!(SizeResult::parse(&r.to_line()).is_err(), "a non-finite time cannot pass as a result");
    }
}
