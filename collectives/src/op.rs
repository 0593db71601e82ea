//! Reduction operators.

/// How a reduction combines values from the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (integers wrap on overflow).
    Sum,
    /// Product (integers wrap on overflow).
    Prod,
    /// Minimum (for floats, NaN inputs give an unspecified one of the operands).
    Min,
    /// Maximum (same NaN rule as `Min`).
    Max,
    /// Sum divided by the number of ranks (integers: truncating division of the wrapped sum).
    Avg,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg];

    /// The name nccl-tests prints.
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The operator's code in the GPU kernels' argument blocks (`weave::Op` in
    /// `weave/reduce.cuh`).
    #[cfg(feature = "cuda")]
    pub(crate) const fn kernel_code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
        }
    }

    /// Parses a name as printed by [`name`](Self::name).
    pub fn parse(s: &str) -> Option<ReduceOp> {
        let s = s.trim().to_ascii_lowercase();
        ReduceOp::ALL.into_iter().find(|o| o.name() == s)
    }
}
