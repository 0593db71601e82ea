//! `weave-bench --ranks-sweep LIST`: the same benchmark at several world sizes, then one
//! table of what changes with the number of ranks — communicator creation time and the time
//! of each size, weave's and Open MPI's, both measured in the same run per world size — and
//! the wall time of a whole job (start the ranks, create, [`JOB_CALLS`] calls of the smallest
//! size, exit), weave's and Open MPI's run one after the other.

use crate::record::SizeResult;
use crate::table::fmt_time;

/// One run's rows: weave's, each with Open MPI's of the same size when it ran.
pub(crate) type Joined = Vec<(SizeResult, Option<SizeResult>)>;

/// Calls of the smallest size that the whole job makes after creating its communicator.
pub(crate) const JOB_CALLS: u64 = 200;

/// Wall times of the whole job at one world size, in seconds: from starting the ranks to the
/// exit of the last one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct JobWalls {
    /// weave's job (`cargo xtask launch` of bench-worker).
    pub(crate) weave: f64,
    /// The slowest rank's communicator creation in weave's job, as it reported it.
    pub(crate) weave_create: Option<f64>,
    /// Open MPI's job (`mpirun` of the baseline), when it ran.
    pub(crate) mpi: Option<f64>,
    /// The slowest rank's `MPI_Init` in Open MPI's job, as it reported it.
    pub(crate) mpi_init: Option<f64>,
}

/// Column titles and widths of the sweep table.
const COLUMNS: [(&str, usize); 12] = [
    ("ranks", 6),
    ("size(B)", 8),
    ("create(s)", 9),
    ("time(us)", 10),
    ("algorithm", 16),
    ("mpi init(s)", 11),
    ("mpi time(us)", 12),
    ("mpi/weave", 9),
    ("job(s)", 6),
    ("(create)", 8),
    ("mpi job(s)", 10),
    ("(init)", 6),
];

fn join(cells: &[String]) -> String {
    let mut line = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS).enumerate() {
        match i {
            0 => line.push_str(&format!("{cell:>width$}")),
            4 => line.push_str(&format!("  {cell:<width$}")),
            _ => line.push_str(&format!("  {cell:>width$}")),
        }
    }
    line.trim_end().to_string()
}

/// The table of a sweep: one line per world size and size, from each run's rows (weave's and,
/// when it ran, Open MPI's) and the world size's whole-job wall times.
pub(crate) fn table(runs: &[(usize, Joined, JobWalls)]) -> String {
    let seconds = |s: Option<f64>| s.map_or_else(|| "-".to_string(), |s| format!("{s:.2}"));
    let mut out = format!("#{}", &join(&COLUMNS.map(|c| c.0.to_string()))[1..]);
    for (ranks, rows, walls) in runs {
        for (weave, mpi) in rows {
            let ratio = mpi
                .as_ref()
                .filter(|m| m.time_us > 0.0 && weave.time_us > 0.0)
                .map_or_else(|| "N/A".to_string(), |m| format!("{:.2}", m.time_us / weave.time_us));
            let cells = [
                ranks.to_string(),
                weave.bytes.to_string(),
                seconds(weave.create_s),
                fmt_time(weave.time_us),
                weave.algorithm.clone(),
                seconds(mpi.as_ref().and_then(|m| m.create_s)),
                mpi.as_ref().map_or_else(|| "-".to_string(), |m| fmt_time(m.time_us)),
                ratio,
                seconds(Some(walls.weave)),
                seconds(walls.weave_create),
                seconds(walls.mpi),
                seconds(walls.mpi_init),
            ];
            out.push('\n');
            out.push_str(&join(&cells));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_line_per_world_size_and_size() {
        let row = |time_us: f64, create_s: Option<f64>, algorithm: &str| {
            let line = format!(
                r#"{{"op":"all_reduce","bytes":8,"count":2,"dtype":"float","redop":"sum","inplace":false,"ranks":8,"time_us":{time_us},"algbw":{},"busbw":{},"wrong":0,"algorithm":"{algorithm}"{}}}"#,
                8.0 / 1e3 / time_us,
                8.0 / 1e3 / time_us * 1.75,
                create_s.map_or(String::new(), |c| format!(r#","create_s":{c}"#)),
            );
            SizeResult::parse(&line).unwrap()
        };
        let runs = vec![
            (
                8,
                vec![(row(10.0, Some(0.04), "one_shot"), Some(row(20.0, Some(0.5), "mpi")))],
                JobWalls { weave: 0.3, weave_create: Some(0.05), mpi: Some(1.25), mpi_init: Some(0.4) },
            ),
            (
                64,
                vec![(row(400.0, None, "one_shot"), None)],
                JobWalls { weave: 2.0, weave_create: None, mpi: None, mpi_init: None },
            ),
        ];
        let t = table(&runs);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with('#') && lines[0].contains("mpi/weave"));
        let eight: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            eight,
            ["8", "8", "0.04", "10.00", "one_shot", "0.50", "20.00", "2.00", "0.30", "0.05", "1.25", "0.40"]
        );
        let sixty_four: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(sixty_four, ["64", "8", "-", "400.0", "one_shot", "-", "-", "N/A", "2.00", "-", "-", "-"]);
    }
}
