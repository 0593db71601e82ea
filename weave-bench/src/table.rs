//! The nccl-tests-style table of a host run: one line per size, weave's result and (with
//! `--vs-mpi`) Open MPI's beside it with the ratios, and a footer.

use crate::record::SizeResult;

/// A row's time, marked `*` when its ranks shared a CPU.
fn fmt_row_time(r: &SizeResult) -> String {
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
    pub(crate) fn line(&self, row: &SizeResult, mpi: Option<&SizeResult>) -> String {
        let mut cells = vec![
            row.bytes.to_string(),
            row.count.to_string(),
            row.dtype.clone(),
            row.redop.clone(),
            fmt_row_time(row),
            format!("{:.2}", row.algbw),
            format!("{:.2}", row.busbw),
            fmt_wrong(row.wrong),
            row.algorithm.clone(),
        ];
        if self.vs_mpi {
            match mpi {
                Some(m) => cells.extend([
                    fmt_row_time(m),
                    format!("{:.2}", m.busbw),
                    fmt_wrong(m.wrong),
                    fmt_ratio(ratio(m.time_us, row.time_us)),
                    fmt_ratio(ratio(row.busbw, m.busbw)),
                ]),
                None => cells.extend(["-", "-", "-", "N/A", "N/A"].map(String::from)),
            }
        }
        self.join(&cells)
    }

    /// The footer: wrong values, average bus bandwidth, and the geometric means of the ratios.
    pub(crate) fn footer(&self, rows: &[(SizeResult, Option<SizeResult>)]) -> String {
        let wrong: u64 = rows.iter().filter_map(|(r, _)| r.wrong).sum();
        let checked = rows.iter().any(|(r, _)| r.wrong.is_some());
        let mut out = String::new();
        if checked {
            out.push_str(&format!("# Out of bounds values : {wrong} {}\n", if wrong == 0 { "OK" } else { "FAILED" }));
        } else {
            out.push_str("# Out of bounds values : not checked (--no-check)\n");
        }
        let avg = |v: Vec<f64>| if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 };
        out.push_str(&format!("# Avg bus bandwidth    : {:.3} GB/s", avg(rows.iter().map(|(r, _)| r.busbw).collect())));
        if self.vs_mpi {
            let mpi: Vec<&SizeResult> = rows.iter().filter_map(|(_, m)| m.as_ref()).collect();
            out.push_str(&format!(" (Open MPI: {:.3} GB/s)", avg(mpi.iter().map(|m| m.busbw).collect())));
            let mpi_wrong: u64 = mpi.iter().filter_map(|m| m.wrong).sum();
            if mpi_wrong > 0 {
                out.push_str(&format!("\n# Open MPI wrong values: {mpi_wrong} FAILED"));
            }
            let times: Vec<f64> =
                rows.iter().filter_map(|(r, m)| m.as_ref().and_then(|m| ratio(m.time_us, r.time_us))).collect();
            let bws: Vec<f64> =
                rows.iter().filter_map(|(r, m)| m.as_ref().and_then(|m| ratio(r.busbw, m.busbw))).collect();
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
    use collectives::Collective;

    fn result(bytes: u64, time_us: f64, algorithm: &str) -> SizeResult {
        let mut r = SizeResult::new(Collective::AllReduce, bytes, bytes / 4, 2, time_us);
        (r.dtype, r.redop, r.wrong, r.algorithm) = ("float".into(), "sum".into(), Some(0), algorithm.into());
        r
    }

    #[test]
    fn formats_the_table() {
        let w = result(1 << 20, 250.0, "one_shot");
        let m = result(1 << 20, 125.0, "mpi");
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
        let z = result(0, 3.0, "one_shot");
        assert!(t.line(&z, Some(&z)).ends_with("1.00          N/A"));
        // Ranks that shared a CPU are marked, and the footer says what the mark means.
        let shared = SizeResult { shared_cpu: true, ..result(8, 60.0, "one_shot") };
        assert!(t.line(&shared, None).contains(" 60.00*"));
        assert!(t.footer(&[(shared.clone(), None)]).contains("# * at the end of this size two ranks were on one CPU"));
        assert!(!t.footer(&[(w.clone(), None)]).contains("# *"));
    }
}
