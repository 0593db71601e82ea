//! The benchmark's data: the collectives and their bus-bandwidth factors, one result line
//! (parsed from the JSON lines the bench worker and the MPI baseline print), and the
//! nccl-tests-style table.

use crate::json::{Object, Value};

/// A collective the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// All-reduce.
    AllReduce,
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter,
    /// Broadcast from rank 0.
    Broadcast,
    /// Reduce to rank 0.
    Reduce,
    /// All-to-all.
    AllToAll,
}

impl Op {
    /// Every collective, in the order the help lists them.
    pub(crate) const ALL: [Op; 6] =
        [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::Broadcast, Op::Reduce, Op::AllToAll];

    /// The name both bench programs use (`all_reduce`).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
        }
    }

    /// Parses a name; `-` for `_` and no separator at all are accepted (`allreduce`).
    pub(crate) fn parse(s: &str) -> Option<Op> {
        let s = s.trim().to_ascii_lowercase().replace('-', "_");
        Op::ALL.into_iter().find(|o| o.name() == s || o.name().replace('_', "") == s)
    }

    /// Whether the collective takes a reduction operator.
    pub(crate) const fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }

    /// nccl-tests' bus-bandwidth factor for `ranks` ranks: all-reduce 2(n-1)/n; all-gather,
    /// reduce-scatter, all-to-all (n-1)/n; broadcast, reduce 1.
    pub(crate) fn bus_factor(self, ranks: u64) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce => 1.0,
        }
    }
}

/// Element types: (nccl-tests name, Rust name).
pub(crate) const DTYPES: [(&str, &str); 10] = [
    ("float", "f32"),
    ("double", "f64"),
    ("half", "f16"),
    ("bfloat16", "bf16"),
    ("int8", "i8"),
    ("uint8", "u8"),
    ("int32", "i32"),
    ("uint32", "u32"),
    ("int64", "i64"),
    ("uint64", "u64"),
];

/// The nccl-tests name of a data type given by either name.
pub(crate) fn dtype_name(s: &str) -> Option<&'static str> {
    let s = s.trim().to_ascii_lowercase();
    DTYPES.iter().find(|(n, r)| *n == s || *r == s).map(|(n, _)| *n)
}

/// Reduction operators.
pub(crate) const REDOPS: [&str; 5] = ["sum", "prod", "min", "max", "avg"];

/// Algorithm bandwidth in GB/s (1e9 bytes per second) of `bytes` moved in `time_us`.
pub(crate) fn algbw(bytes: u64, time_us: f64) -> f64 {
    if time_us > 0.0 { bytes as f64 / 1e3 / time_us } else { 0.0 }
}

/// One size of a run, as one JSON line of a bench program reports it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Row {
    /// The collective.
    pub(crate) op: Op,
    /// Bytes of the largest buffer.
    pub(crate) bytes: u64,
    /// Elements per rank (per block for the block collectives).
    pub(crate) count: u64,
    /// Element type name.
    pub(crate) dtype: String,
    /// Reduction operator name (`none` where the collective does not reduce).
    pub(crate) redop: String,
    /// In place or not.
    pub(crate) inplace: bool,
    /// Number of ranks.
    pub(crate) ranks: u64,
    /// Median over the timed calls of the slowest rank's time, in microseconds.
    pub(crate) time_us: f64,
    /// Wrong elements over all ranks and calls; `None` when not checked.
    pub(crate) wrong: Option<u64>,
    /// The algorithm that ran (`mpi` for the baseline).
    pub(crate) algorithm: String,
    /// At the end of the size, two ranks were on one CPU (their waits then went through the
    /// scheduler). False when the line does not say.
    pub(crate) shared_cpu: bool,
    /// Seconds the slowest rank took to create the communicator (weave) or initialize MPI,
    /// when the line says.
    pub(crate) create_s: Option<f64>,
    /// How many distinct hosts the ranks ran on, when the line says (the Open MPI baseline's
    /// do: it is checked against the nodes it was asked to use).
    pub(crate) nodes: Option<u64>,
}

impl Row {
    /// Parses one JSON line. The bandwidths it carries must agree with its bytes and time.
    pub(crate) fn from_json(line: &str) -> Result<Row, String> {
        let o = Object::parse(line)?;
        let op_name = o.str("op")?;
        let op = Op::parse(op_name).ok_or_else(|| format!("unknown op {op_name:?}"))?;
        let wrong = match o.get("wrong") {
            Some(Value::Null) => None,
            Some(_) => Some(o.uint("wrong")?),
            None => return Err("missing \"wrong\"".into()),
        };
        let row = Row {
            op,
            bytes: o.uint("bytes")?,
            count: o.uint("count")?,
            dtype: o.str("dtype")?.to_string(),
            redop: o.str("redop")?.to_string(),
            inplace: o.bool("inplace")?,
            ranks: o.uint("ranks")?,
            time_us: o.num("time_us")?,
            wrong,
            algorithm: o.str("algorithm")?.to_string(),
            shared_cpu: match o.get("shared_cpu") {
                None => false,
                Some(_) => o.bool("shared_cpu")?,
            },
            create_s: match o.get("create_s") {
                None | Some(Value::Null) => None,
                Some(_) => Some(o.num("create_s")?),
            },
            nodes: match o.get("nodes") {
                None | Some(Value::Null) => None,
                Some(_) => Some(o.uint("nodes")?),
            },
        };
        if row.time_us < 0.0 {
            return Err(format!("negative time {}", row.time_us));
        }
        for (key, want) in [("algbw", row.algbw()), ("busbw", row.busbw())] {
            let got = o.num(key)?;
            if (got - want).abs() > 1e-6 * want.abs().max(1e-9) {
                return Err(format!("{key} {got} does not match bytes / time ({want})"));
            }
        }
        Ok(row)
    }

    /// Algorithm bandwidth, GB/s.
    pub(crate) fn algbw(&self) -> f64 {
        algbw(self.bytes, self.time_us)
    }

    /// Bus bandwidth, GB/s (algbw × nccl-tests' factor).
    pub(crate) fn busbw(&self) -> f64 {
        self.algbw() * self.op.bus_factor(self.ranks)
    }

    /// The `--json` record of this row and its baseline.
    pub(crate) fn to_json(&self, mpi: Option<&Row>) -> Object {
        let mut o = Object::default();
        o.push("op", Value::Str(self.op.name().into()))
            .push("bytes", Value::Num(self.bytes as f64))
            .push("count", Value::Num(self.count as f64))
            .push("dtype", Value::Str(self.dtype.clone()))
            .push("redop", Value::Str(self.redop.clone()))
            .push("inplace", Value::Bool(self.inplace))
            .push("ranks", Value::Num(self.ranks as f64))
            .push("time_us", Value::Num(self.time_us))
            .push("algbw", Value::Num(self.algbw()))
            .push("busbw", Value::Num(self.busbw()))
            .push("wrong", self.wrong.map_or(Value::Null, |w| Value::Num(w as f64)))
            .push("algorithm", Value::Str(self.algorithm.clone()))
            .push("shared_cpu", Value::Bool(self.shared_cpu));
        if let Some(c) = self.create_s {
            o.push("create_s", Value::Num(c));
        }
        if let Some(m) = mpi {
            o.push("mpi_time_us", Value::Num(m.time_us))
                .push("mpi_algbw", Value::Num(m.algbw()))
                .push("mpi_busbw", Value::Num(m.busbw()))
                .push("mpi_wrong", m.wrong.map_or(Value::Null, |w| Value::Num(w as f64)))
                .push("mpi_shared_cpu", Value::Bool(m.shared_cpu));
            if let Some(c) = m.create_s {
                o.push("mpi_create_s", Value::Num(c));
            }
        }
        o
    }
}

/// A row's time, marked `*` when its ranks shared a CPU.
fn fmt_row_time(r: &Row) -> String {
    format!("{}{}", fmt_time(r.time_us), if r.shared_cpu { "*" } else { "" })
}

/// nccl-tests' time format: more decimals for shorter times.
pub(crate) fn fmt_time(us: f64) -> String {
    if us >= 10_000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

fn fmt_wrong(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".into(), |w| w.to_string())
}

/// `a / b`, or `None` when it means nothing (a zero or non-finite operand).
fn ratio(a: f64, b: f64) -> Option<f64> {
    (a > 0.0 && b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "N/A".into(), |r| format!("{r:.2}"))
}

/// Column titles (two header lines) and widths; the first four are the row's identity.
const COLUMNS: [(&str, &str, usize); 9] = [
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 8),
    ("redop", "", 6),
    ("time", "(us)", 9),
    ("algbw", "(GB/s)", 7),
    ("busbw", "(GB/s)", 7),
    ("#wrong", "", 6),
    ("algorithm", "", 10),
];

/// The baseline's columns, printed with `--vs-mpi`.
const MPI_COLUMNS: [(&str, &str, usize); 5] = [
    ("mpi time", "(us)", 9),
    ("mpi busbw", "(GB/s)", 9),
    ("#wrong", "", 6),
    ("time ratio", "mpi/weave", 10),
    ("busbw ratio", "weave/mpi", 11),
];

/// Prints the table: header, one line per size, footer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Table {
    /// Whether the baseline's columns are printed.
    pub(crate) vs_mpi: bool,
}

impl Table {
    fn columns(&self) -> Vec<(&'static str, &'static str, usize)> {
        let mut c = COLUMNS.to_vec();
        if self.vs_mpi {
            c.extend(MPI_COLUMNS);
        }
        c
    }

    fn join(&self, cells: &[String]) -> String {
        let mut line = String::new();
        for (i, (cell, (_, _, width))) in cells.iter().zip(self.columns()).enumerate() {
            // The algorithm column is the only left-aligned one.
            if i == 8 {
                line.push_str(&format!("  {cell:<width$}"));
            } else {
                line.push_str(&format!("{}{cell:>width$}", if i == 0 { "" } else { "  " }));
            }
        }
        line.trim_end().to_string()
    }

    /// The two header lines (starting with `#`).
    pub(crate) fn header(&self) -> String {
        let first: Vec<String> = self.columns().iter().map(|c| c.0.to_string()).collect();
        let second: Vec<String> = self.columns().iter().map(|c| c.1.to_string()).collect();
        format!("#{}\n#{}", &self.join(&first)[1..], &self.join(&second)[1..])
    }

    /// One line of the table for `row` and its baseline (when there is one).
    pub(crate) fn line(&self, row: &Row, mpi: Option<&Row>) -> String {
        let mut cells = vec![
            row.bytes.to_string(),
            row.count.to_string(),
            row.dtype.clone(),
            row.redop.clone(),
            fmt_row_time(row),
            format!("{:.2}", row.algbw()),
            format!("{:.2}", row.busbw()),
            fmt_wrong(row.wrong),
            row.algorithm.clone(),
        ];
        if self.vs_mpi {
            match mpi {
                Some(m) => cells.extend([
                    fmt_row_time(m),
                    format!("{:.2}", m.busbw()),
                    fmt_wrong(m.wrong),
                    fmt_ratio(ratio(m.time_us, row.time_us)),
                    fmt_ratio(ratio(row.busbw(), m.busbw())),
                ]),
                None => cells.extend(["-", "-", "-", "N/A", "N/A"].map(String::from)),
            }
        }
        self.join(&cells)
    }

    /// The footer: wrong values, average bus bandwidth, and the geometric means of the ratios.
    pub(crate) fn footer(&self, rows: &[(Row, Option<Row>)]) -> String {
        let wrong: u64 = rows.iter().filter_map(|(r, _)| r.wrong).sum();
        let checked = rows.iter().any(|(r, _)| r.wrong.is_some());
        let mut out = String::new();
        if checked {
            out.push_str(&format!("# Out of bounds values : {wrong} {}\n", if wrong == 0 { "OK" } else { "FAILED" }));
        } else {
            out.push_str("# Out of bounds values : not checked (--no-check)\n");
        }
        let avg = |v: Vec<f64>| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        out.push_str(&format!(
            "# Avg bus bandwidth    : {:.3} GB/s",
            avg(rows.iter().map(|(r, _)| r.busbw()).collect())
        ));
        if self.vs_mpi {
            let mpi: Vec<&Row> = rows.iter().filter_map(|(_, m)| m.as_ref()).collect();
            out.push_str(&format!(" (Open MPI: {:.3} GB/s)", avg(mpi.iter().map(|m| m.busbw()).collect())));
            let mpi_wrong: u64 = mpi.iter().filter_map(|m| m.wrong).sum();
            if mpi_wrong > 0 {
                out.push_str(&format!("\n# Open MPI wrong values: {mpi_wrong} FAILED"));
            }
            let times: Vec<f64> =
                rows.iter().filter_map(|(r, m)| m.as_ref().and_then(|m| ratio(m.time_us, r.time_us))).collect();
            let bws: Vec<f64> =
                rows.iter().filter_map(|(r, m)| m.as_ref().and_then(|m| ratio(r.busbw(), m.busbw()))).collect();
            out.push_str(&format!(
                "\n# Geomean time ratio mpi/weave : {} over {} sizes (above 1: weave is faster)",
                fmt_ratio(geomean(&times)),
                times.len()
            ));
            out.push_str(&format!(
                "\n# Geomean busbw ratio weave/mpi: {} over {} sizes",
                fmt_ratio(geomean(&bws)),
                bws.len()
            ));
        }
        if rows.iter().any(|(r, m)| r.shared_cpu || m.as_ref().is_some_and(|m| m.shared_cpu)) {
            out.push_str(
                "\n# * at the end of this size two ranks were on one CPU (another process held the other \
                 cores, or there are more ranks than cores): the time includes the scheduler",
            );
        }
        out
    }
}

/// The geometric mean of positive values; `None` for none.
fn geomean(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    Some((v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(op: &str, bytes: u64, ranks: u64, time_us: f64, wrong: &str) -> String {
        let ab = algbw(bytes, time_us);
        let bb = ab * Op::parse(op).map_or(1.0, |o| o.bus_factor(ranks));
        format!(
            r#"{{"op":"{op}","bytes":{bytes},"count":{},"dtype":"float","redop":"sum","inplace":false,"ranks":{ranks},"time_us":{time_us},"algbw":{ab},"busbw":{bb},"wrong":{wrong},"algorithm":"one_shot"}}"#,
            bytes / 4
        )
    }

    #[test]
    fn bus_factors_follow_nccl_tests() {
        assert_eq!(Op::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Op::AllReduce.bus_factor(4), 1.5);
        assert_eq!(Op::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Op::AllGather.bus_factor(4), 0.75);
        assert_eq!(Op::ReduceScatter.bus_factor(2), 0.5);
        assert_eq!(Op::AllToAll.bus_factor(8), 0.875);
        assert_eq!(Op::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Op::Reduce.bus_factor(3), 1.0);
        assert_eq!(Op::AllReduce.bus_factor(1), 0.0);
        assert_eq!(Op::parse("AllReduce"), Some(Op::AllReduce));
        assert_eq!(Op::parse("all-to-all"), Some(Op::AllToAll));
        assert_eq!(Op::parse("gather"), None);
        assert_eq!(dtype_name("bf16"), Some("bfloat16"));
        assert_eq!(dtype_name("FLOAT"), Some("float"));
        assert_eq!(dtype_name("complex"), None);
        // 1 MB in 1000 us is 1 GB/s.
        assert_eq!(algbw(1_000_000, 1000.0), 1.0);
        assert_eq!(algbw(8, 0.0), 0.0);
    }

    #[test]
    fn parses_result_lines() {
        let r = Row::from_json(&line("all_reduce", 1 << 20, 4, 100.0, "0")).unwrap();
        assert_eq!((r.op, r.bytes, r.count, r.ranks, r.wrong), (Op::AllReduce, 1 << 20, 1 << 18, 4, Some(0)));
        assert!((r.busbw() - 1.5 * 10.48576).abs() < 1e-9);
        let r = Row::from_json(&line("all_gather", 64, 2, 3.5, "null")).unwrap();
        assert_eq!(r.wrong, None);
        // Bandwidths that do not match bytes and time, bad types, and garbage are errors.
        let bad_bw = line("all_reduce", 1024, 2, 1.0, "0").replace("\"busbw\":", "\"busbw\":9");
        assert!(Row::from_json(&bad_bw).unwrap_err().contains("busbw"));
        assert!(Row::from_json(&line("gather", 8, 2, 1.0, "0")).unwrap_err().contains("unknown op"));
        assert!(Row::from_json(&line("all_reduce", 8, 2, 1.0, "-1")).is_err());
        assert!(Row::from_json(&line("all_reduce", 8, 2, 1.0, "\"x\"")).is_err());
        assert!(Row::from_json("{\"op\":\"all_reduce\"}").unwrap_err().contains("missing"));
        assert!(Row::from_json("not json").is_err());
    }

    #[test]
    fn formats_the_table() {
        let w = Row::from_json(&line("all_reduce", 1 << 20, 2, 250.0, "0")).unwrap();
        let m = Row::from_json(&line("all_reduce", 1 << 20, 2, 125.0, "0").replace("one_shot", "mpi")).unwrap();
        let t = Table { vs_mpi: false };
        let header = t.header();
        assert!(header.starts_with("#       size         count"), "{header}");
        assert!(header.contains("busbw") && header.contains("(GB/s)") && header.contains("#wrong"));
        assert!(!header.contains("mpi"));
        let l = t.line(&w, None);
        assert_eq!(l, "     1048576        262144     float     sum      250.0     4.19     4.19       0  one_shot");
        let t = Table { vs_mpi: true };
        assert!(t.header().contains("mpi/weave") && t.header().contains("weave/mpi"));
        let l = t.line(&w, Some(&m));
        assert!(l.ends_with("125.0       8.39       0        0.50         0.50"), "{l}");
        assert!(t.line(&w, None).ends_with("N/A          N/A"));
        let footer = t.footer(&[(w.clone(), Some(m.clone()))]);
        assert!(footer.contains("Out of bounds values : 0 OK"), "{footer}");
        assert!(footer.contains("Geomean time ratio mpi/weave : 0.50 over 1 sizes"), "{footer}");
        let mut bad = w.clone();
        bad.wrong = Some(3);
        assert!(Table { vs_mpi: false }.footer(&[(bad, None)]).contains("3 FAILED"));
        assert_eq!(fmt_time(12345.6), "12346");
        assert_eq!(fmt_time(123.45), "123.5");
        assert_eq!(fmt_time(1.234), "1.23");
        assert_eq!(geomean(&[1.0, 4.0]), Some(2.0));
        // A zero-byte row (tiny all_gather) has no bandwidth ratio.
        let z = Row::from_json(&line("all_gather", 0, 2, 3.0, "0")).unwrap();
        assert!(t.line(&z, Some(&z)).ends_with("1.00          N/A"));
        // Ranks that shared a CPU are marked, and the footer says what the mark means.
        let shared =
            Row::from_json(&line("all_reduce", 8, 2, 60.0, "0").replace("}", ",\"shared_cpu\":true}")).unwrap();
        assert!(shared.shared_cpu && !w.shared_cpu);
        assert!(t.line(&shared, None).contains(" 60.00*"));
        assert!(t.footer(&[(shared.clone(), None)]).contains("# * at the end of this size two ranks were on one CPU"));
        assert!(!t.footer(&[(w.clone(), None)]).contains("# *"));
        assert_eq!(shared.to_json(Some(&m)).get("mpi_shared_cpu"), Some(&Value::Bool(false)));
    }
}
