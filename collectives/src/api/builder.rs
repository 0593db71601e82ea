//! How a [`Communicator`] comes to be: the [`Builder`] and the transports it starts from, where
//! a communicator sits in its job ([`Lineage`]), and the assembly of a communicator from its
//! parts — the primitives layer, the resilience state, the host, channel and GPU executors —
//! for a new job's communicator and for the splits, shrinks and grows made from one.

use std::cell::{Cell, OnceCell, RefCell};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};

use comm_core::bootstrap::{Bootstrap, TcpBootstrap, UniqueId};
use comm_core::communicator::Communicator as CoreCommunicator;
use comm_core::config::Config;
use comm_core::notice::NoticeService;
use comm_core::resilience::Resilience;
use comm_core::transport::TransportFactory;
use comm_core::{Error, Result};

use crate::api::communicator::Communicator;
use crate::channel::ChannelEngine;
use crate::host::{HostEngine, HostSource};
use crate::table::{Algorithm, AlgorithmTable, Collective, Family};

/// The transports compiled in by Cargo features, in preference order.
#[allow(clippy::vec_init_then_push, unused_mut, reason = "one push per enabled feature")]
pub fn default_transports() -> Vec<Arc<dyn TransportFactory>> {
    let mut v: Vec<Arc<dyn TransportFactory>> = Vec::new();
    #[cfg(feature = "cudaipc")]
    v.push(Arc::new(transport_cudaipc::CudaIpcTransport::new()));
    #[cfg(feature = "shm")]
    v.push(Arc::new(transport_shm::ShmTransport));
    #[cfg(feature = "ib")]
    v.push(Arc::new(transport_ib::IbTransport::new()));
    #[cfg(feature = "tcp")]
    v.push(Arc::new(transport_tcp::TcpTransport::new()));
    v
}

/// Builds a [`Communicator`].
pub struct Builder {
    bootstrap: Arc<dyn Bootstrap>,
    factories: Vec<Arc<dyn TransportFactory>>,
    config: Option<Config>,
    #[cfg(feature = "cuda")]
    gpu_config: Option<crate::gpu::GpuConfig>,
    overrides: Vec<(Option<Collective>, Algorithm)>,
    family: Option<Family>,
    /// The primitives layer, when it is built already (a shrink's, carried over from its
    /// parent: [`CoreCommunicator::carry_over`]).
    core: Option<CoreCommunicator>,
    /// The flag that calls the build off (see [`Builder::with_cancel_flag`]).
    cancel: Option<Arc<AtomicBool>>,
}

impl Builder {
    /// Adds a transport (the first one added replaces the defaults; later ones add to it).
    pub fn with_transport(mut self, factory: impl TransportFactory + 'static) -> Self {
        self.factories.push(Arc::new(factory));
        self
    }

    /// Uses `config` instead of the `WEAVE_*` environment.
    pub fn with_config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self
    }

    /// Uses `gpu_config` for the GPU path's tuning knobs instead of the `WEAVE_GPU_*`
    /// environment (every rank should pass the same).
    #[cfg(feature = "cuda")]
    pub fn with_gpu_config(mut self, gpu_config: crate::gpu::GpuConfig) -> Self {
        self.gpu_config = Some(gpu_config);
        self
    }

    /// Forces `algorithm` for `collective` (every rank must force the same).
    pub fn with_algorithm(mut self, collective: Collective, algorithm: Algorithm) -> Self {
        self.overrides.push((Some(collective), algorithm));
        self
    }

    /// Restricts the algorithm table to `family` where it runs (every rank must pass the same);
    /// `WEAVE_ALGO=channel` does this for [`Family::Channel`].
    pub fn with_algorithm_family(mut self, family: Family) -> Self {
        self.family = Some(family);
        self
    }

    /// Lets another thread call the build off: setting `cancel` while [`build`](Self::build)
    /// waits for peers in its first exchange (the endpoints: where a rank that never comes is
    /// waited for) ends the build with [`Error::Aborted`], and a build that finds it set at its
    /// end fails the same way (what `ncclCommAbort` does to a communicator still being made; the
    /// exchanges in between, once every rank is there, run to their end). The flag is the
    /// build's alone: the communicator it makes has an abort flag of its own
    /// ([`AbortHandle`](crate::AbortHandle)). Every rank passes a flag or none (see
    /// [`CommunicatorBuilder::with_cancel_flag`](comm_core::communicator::CommunicatorBuilder::with_cancel_flag)).
    /// Pass the same flag to
    /// [`TcpBootstrap::with_roots_cancellable`] to call off the rendezvous before it as well:
    ///
    /// ```no_run
    /// # use std::sync::{Arc, atomic::{AtomicBool, Ordering}};
    /// # use std::time::Duration;
    /// # use collectives::Communicator;
    /// # use comm_core::bootstrap::{TcpBootstrap, UniqueId};
    /// # fn f(id: UniqueId, rank: usize, world_size: usize) {
    /// let give_up = Arc::new(AtomicBool::new(false));
    /// let flag = give_up.clone();
    /// let making = std::thread::spawn(move || {
    ///     let boot = TcpBootstrap::with_roots_cancellable(&[id], rank, world_size, Duration::from_secs(600), flag.clone())?;
    ///     Communicator::builder(boot).with_cancel_flag(flag).build()
    /// });
    /// // … the job is being torn down before every rank came:
    /// give_up.store(true, Ordering::Release);
    /// // Err(Error::Aborted) within milliseconds, unless every rank had come by then.
    /// let outcome = making.join().expect("the thread making the communicator");
    /// # }
    /// ```
    pub fn with_cancel_flag(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = Some(cancel);
        self
    }

    /// The builder of a child of `parent` (a split or shrink) over `bootstrap`, called off by an
    /// abort of the parent (not by its revocation: see [`Resilience::aborted`]): the parent's
    /// transports and settings.
    pub(crate) fn for_child(parent: &Communicator, bootstrap: Arc<dyn Bootstrap>) -> Builder {
        Builder {
            bootstrap,
            factories: parent.factories.clone(),
            config: Some(parent.config.clone()),
            #[cfg(feature = "cuda")]
            gpu_config: Some(parent.gpu_config.clone()),
            overrides: Vec::new(),
            family: None,
            core: None,
            cancel: Some(parent.resilience.aborted().clone()),
        }
    }

    /// The builder of a child of `parent` whose primitives layer is `core`, built already.
    pub(crate) fn for_child_over(parent: &Communicator, core: CoreCommunicator) -> Builder {
        let bootstrap = core.bootstrap().clone();
        // No exchange of endpoints to call off: a shrink, which an aborted parent may make.
        Builder { core: Some(core), cancel: None, ..Self::for_child(parent, bootstrap) }
    }

    /// Collective: connects the ranks and builds the host workspace.
    pub fn build(self) -> Result<Communicator> {
        let n = self.bootstrap.world_size();
        Communicator::build(self, Lineage { root: None, namespace: 0, root_ranks: (0..n).collect(), notices: None })
    }
}

/// Where a communicator sits in the job: the root bootstrap, its tag namespace, the root ranks
/// of its members and the notice service of the root bootstrap (started with a job's first
/// communicator, shared by its splits and shrinks).
pub(crate) struct Lineage {
    pub(crate) root: Option<Arc<dyn Bootstrap>>,
    pub(crate) namespace: u64,
    pub(crate) root_ranks: Vec<usize>,
    pub(crate) notices: Option<Arc<NoticeService>>,
}

impl Communicator {
    /// Starts building a communicator over `bootstrap` with the default transports.
    pub fn builder(bootstrap: impl Bootstrap + 'static) -> Builder {
        Builder {
            bootstrap: Arc::new(bootstrap),
            factories: Vec::new(),
            config: None,
            #[cfg(feature = "cuda")]
            gpu_config: None,
            overrides: Vec::new(),
            family: None,
            core: None,
            cancel: None,
        }
    }

    /// Collective: a communicator of all ranks of a job launched by `cargo xtask launch`,
    /// torchrun, Open MPI or Slurm (see [`comm_core::bootstrap::from_env`]).
    pub fn from_env() -> Result<Self> {
        Self::builder(comm_core::bootstrap::from_env()?).build()
    }

    /// Collective: a communicator of `world_size` ranks meeting at `id` (rank 0 listens there).
    pub fn from_unique_id(id: &UniqueId, rank: usize, world_size: usize) -> Result<Self> {
        let config = Config::from_env()?;
        Self::builder(TcpBootstrap::new(id, rank, world_size, config.timeout)?).with_config(config).build()
    }

    pub(crate) fn build(b: Builder, lineage: Lineage) -> Result<Self> {
        Self::build_with(b, lineage, HostSource::Fresh)
    }

    /// [`build`](Self::build) with the host engine from `host`.
    pub(crate) fn build_with(b: Builder, lineage: Lineage, host: HostSource<'_>) -> Result<Self> {
        let config = match b.config {
            Some(c) => c,
            None => Config::from_env()?,
        };
        #[cfg(feature = "cuda")]
        let gpu_config = match b.gpu_config {
            Some(c) => c.checked()?,
            None => crate::gpu::GpuConfig::from_env()?,
        };
        let factories = if b.factories.is_empty() { default_transports() } else { b.factories };
        let mut table = AlgorithmTable::default();
        if let Some(spec) = &config.algorithm_overrides {
            table.apply_overrides(spec)?;
        }
        for (c, a) in b.overrides {
            if let Some(c) = c
                && !a.runs_on_host(c)
                && !a.runs_on_device(c)
            {
                return Err(Error::invalid(format!("{c} has no {a} algorithm")));
            }
            table.set_override(c, a);
        }
        if b.family.is_some() {
            table.set_family(b.family);
        }
        let cancel = b.cancel.clone();
        let core = match b.core {
            Some(core) => core,
            None => {
                let mut core = CoreCommunicator::builder_arc(b.bootstrap.clone()).with_config(config.clone());
                if let Some(cancel) = b.cancel {
                    core = core.with_cancel_flag(cancel);
                }
                for f in &factories {
                    core = core.with_transport_arc(f.clone());
                }
                core.build()?
            }
        };
        fit_to_placement(&mut table, &core);
        let root = lineage.root.clone().unwrap_or_else(|| b.bootstrap.clone());
        let notices = match lineage.notices {
            Some(n) => n,
            None => NoticeService::start(root.clone())?,
        };
        let resilience = Resilience::new(
            lineage.namespace,
            lineage.root_ranks.clone(),
            core.rank(),
            root.clone(),
            core.abort_flag().clone(),
        );
        notices.register(&resilience);
        let host =
            HostEngine::from_source(host, &core, config.host_scratch_bytes, resilience.clone())?.map(RefCell::new);
        let channel = RefCell::new(ChannelEngine::new(&core, resilience.clone()));
        #[cfg(feature = "cuda")]
        let gpu = crate::gpu::GpuEngine::new(&core, &gpu_config, &resilience)?;
        #[cfg(feature = "cuda")]
        let gpu_status = gpu.as_ref().map(|g| g.status().clone());
        #[cfg(feature = "cuda")]
        let gpu = gpu.map(RefCell::new);
        #[cfg(feature = "cuda")]
        if let Some(status) = &gpu_status {
            let status = status.clone();
            resilience.on_revoke(Box::new(move || status.abort()));
        }
        // Set after the last wait that looked at it: the caller gave up on this communicator.
        if cancel.is_some_and(|c| c.load(std::sync::atomic::Ordering::Acquire)) {
            return Err(Error::Aborted(format!(
                "rank {} gave up on its new communicator as it was made (the build was called off)",
                core.rank()
            )));
        }
        let world_size = core.world_size();
        Ok(Communicator {
            core,
            #[cfg(feature = "cuda")]
            gpu,
            #[cfg(feature = "cuda")]
            gpu_status,
            #[cfg(feature = "cuda")]
            gpu_config,
            host,
            channel,
            table,
            last_host_plan: Cell::new(None),
            hierarchy: OnceCell::new(),
            steps_run: Cell::new(0),
            factories,
            config,
            root,
            namespace: lineage.namespace,
            root_ranks: lineage.root_ranks,
            splits: AtomicU64::new(0),
            resilience,
            notices,
            known_failed: RefCell::new(std::collections::BTreeSet::new()),
            pair_exchanges: RefCell::new(vec![[0; 2]; world_size]),
        })
    }
}

/// Puts in front of `table` the rows that depend on where the ranks of `core` run (each set at
/// most once): every rank sees the same topology, ranks and cores, so all agree.
pub(crate) fn fit_to_placement(table: &mut AlgorithmTable, core: &CoreCommunicator) {
    // One host whose ranks outnumber its cores.
    if core.topology().all_direct() && core.bootstrap().local_world_size() > comm_core::crowding::host_cpus() {
        table.for_crowded_host();
    }
    if crate::select::one_rank_per_node(core.topology()) {
        table.for_one_rank_per_node();
    }
}
