"""Which view a pod writes: every member (the full view) or its own (rank 0, the job's sizes and its own place).

The one place the choice is made (``choose_view``); init, the sidecar and the follower of a published summary all
ask it. ``--view full`` and ``--view own`` decide it outright. ``--view auto`` (the default) gives a large job's pods
(those that follow a published topology) their own view, which costs a few KiB whatever the job's size, unless
their files must name every member (Node labels need not: a pod reads its own Node, and under ``--rank-order
topology`` its place from its block of the order, core/publication/blocks.py):

- a pod of role ``launcher`` (an MPIJob's, a TrainJob's on an MPI runtime): mpirun runs there, on the hostfile;
- a pod whose role does not train (a parameter server, a driver): its files list the job's pods by role;
- with SSH (``--ssh-secret-dir``) and no launcher role, node rank 0, which launches: DeepSpeed's pdsh runner,
  ``mpirun`` and ``horovodrun`` run there on the hostfile, unless the summary lists every host (DNS names that
  follow the pods' indices, in rank 0's domain: ``hosts_listed``); its own view then writes the hostfile and
  the ``<role>.host`` files from the summary, the same bytes, and no discover_hosts.sh (which lists the Running
  pods: ``--view full`` for horovodrun's ``--host-discovery-script``);
- a pod given the files of a framework that names every member (``Framework.needs_every_member``: MLX's ring
  hostfile, MPI's hostfile for every training pod with ``--frameworks mpi``, TensorFlow's TF_CONFIG unless the
  summary gives every TF role's addresses: ``Framework.own_view_serves``);
- a pod in its own view whose framework files would be written without values (``Framework.blocked``: pods that run
  different numbers of processes, a port only rank 0's container names and the leader did not publish).

A small job's pods read the pods and write every member, as the full view always did: their own view would save
nothing. A small job with Node labels publishes only so that one pod reads the Nodes; its pods write every member
too (``why_full_view``), unless ``--view own`` is asked. Where a pod reads from (the pods, the published snapshot,
the summary) follows from this choice; the leader and the standbys hold every member whatever they write, to
publish and to take over.
"""

from __future__ import annotations

import itertools
import operator

from agent.core.files.frameworks import LAUNCHER_ROLE, new_context, selected
from agent.core.model import Options, Topology
from agent.core.plan.layout import Plan

LARGE_JOB = 256  # training pods from which a job publishes its topology by its size (init and plan read it)
SMALL_JOB = "a job whose pods read the pods (under 256 training pods, or --source pods) writes every member"
C10D_VIEW = "ranks by address (torchrun's c10d rendezvous) make no summary: every member is written"


def why_full_view(options: Options, *, large: bool = False) -> str | None:
    """Why this pod writes every member, known from its options and the job's size alone, before anything is read
    (None: it may read the summary; ``choose_view`` decides once its own place is known). ``large``: the job
    publishes by its size (``LARGE_JOB`` training pods); a smaller one publishes only to read the Nodes once, and
    its pods write every member, as they always did."""
    if options.view == "full":
        return "--view full"
    if options.levels is not None and not large and options.view != "own":
        return "ranks by Node labels (--topology-levels, --rank-order topology) in a job under " \
               f"{LARGE_JOB} training pods: every member is written"
    if options.replica_groups is not None:
        return "replica groups (--replica-groups) are read from every member's labels"
    return None


def every_member_needed(plan: Plan, options: Options, *, ssh: bool) -> str | None:
    """Why this pod's files must name every member (None: rank 0, the job's sizes and its own place are all they
    say); the module's docstring lists the reasons. ``plan`` is the pod's whole plan or its own view's."""
    me, topology = plan.topology.me, plan.topology
    if me.role == LAUNCHER_ROLE:
        return f"role '{LAUNCHER_ROLE}': mpirun runs here, on the hostfile of every training pod"
    if not me.training and not topology.is_spare:  # a hot spare's files say it waits: no host list is needed
        return f"role '{me.role}' does not train: its files list the job's pods by role"
    if ssh and me.node_rank == 0 and LAUNCHER_ROLE not in topology.roles and not hosts_listed(topology):
        return "it launches over SSH (DeepSpeed's pdsh runner, mpirun, horovodrun) and its hostfile names every " \
               "training pod, which the summary cannot list (addresses that follow no template, or outside rank " \
               "0's DNS domain)"
    chosen = selected(plan, options)
    if not chosen:
        return None
    context = new_context(plan, options, trainer=False)
    for framework, _ in chosen:
        if framework.refusal(context) is not None:
            continue
        if framework.needs_every_member and not framework.own_view_serves(context):
            return f"its {framework.title} files ({framework.env_file}) name every member"
        if context.partial:
            blocked = framework.blocked(context, framework.port(plan, options))
            if blocked is not None:
                return f"its {framework.title} files ({framework.env_file}) need more than its own view: {blocked}"
    return None


def hosts_listed(topology: Topology) -> bool:
    """Whether rank 0's own view can write its host lists (hostfile, ``<role>.host``) from the summary, the same
    bytes as the full view: every role's addresses known to the summary (a role of at most ``LISTED_HOSTS`` pods
    is listed, a larger one needs an address template: DNS names that follow the pods' indices), no address
    twice, and every host in rank 0's own DNS domain, so that its known_hosts patterns (core/files/ssh_config.py, made
    from the members it holds) cover every name the hostfile gives. Asked of the own view, all of it (what it
    does: ``Whole.hosts``, from ``Topology.summary_hosts``); of the whole plan, what it tells at little cost (the
    names and their domain): the own view it makes (``summary.own_view``) checks the templates, ~10 ms of a
    16384-pod plan's."""
    if LAUNCHER_ROLE in topology.roles or not topology.training:
        return False
    if topology.whole is not None:
        if topology.summary_hosts is None or any(topology.role_addresses(r) is None for r in topology.roles):
            return False
        addresses = topology.summary_hosts[0]
    else:
        if topology.repeated_hosts:
            return False
        addresses = topology.host_addresses
    rank0 = topology.training[0]
    if not rank0.dns_name or rank0.address != rank0.dns_name or "." not in rank0.dns_name:
        return False
    # Every address is '<a label>.<domain>': its first dot is where the domain starts (C-level passes, 16384 each
    # time a pod that holds every member plans)
    suffix = "." + rank0.dns_name.partition(".")[2]
    return all(map(operator.methodcaller("endswith", suffix), addresses)) and list(
        map(str.find, addresses, itertools.repeat("."))) == list(map(operator.sub, map(len, addresses),
                                                                     itertools.repeat(len(suffix))))


def choose_view(plan: Plan, options: Options, *, ssh: bool, published: bool) -> str | None:
    """Why this pod writes every member (None: it writes its own view). ``published``: the job publishes its
    topology (from 256 training pods); ``ssh``: the pod has the job's SSH material. ``--view own`` gives the own view
    wherever a summary can say the ranks (a framework that needs every member is then written without values)."""
    why = why_full_view(options, large=published and plan.topology.nnodes >= LARGE_JOB)
    if why is None and plan.topology.rank_order == "c10d":
        return C10D_VIEW  # runs of consecutive indices, which a summary states, are not runs of ranks
    if why is not None or options.view == "own":
        return why
    if not published:
        return SMALL_JOB
    return every_member_needed(plan, options, ssh=ssh)
