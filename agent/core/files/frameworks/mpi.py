"""MPI launchers: ``mpi.env`` and ``hydra_hostfile``, so ``mpirun`` reads the live hostfile with no option.

OpenMPI 4 (ORTE) and OpenMPI 5 (PRTE) read the default hostfile, the default slots and the FQDN rule under
different names, and OpenMPI 5 ignores the ORTE names without a word: every rank then runs on the launcher
(kubeflow/trainer#4028, kubeflow/mpi-operator#842, which write the ORTE names only). Both spellings are
written. PRTE's keep-FQDN is false (kubeflow/trainer PR #4029: with short pod names in the hostfile, PRTE with
it true takes the launcher's own line for a remote host and tries to SSH to itself). Intel MPI and MPICH (Hydra)
read ``host:slots`` lines, as the MPI operator writes their hostfile, from ``hydra_hostfile``.

Who gets it: the launcher, where mpirun runs: the pods of role ``launcher`` (an MPIJob's, a TrainJob's on an MPI
runtime) and of the role the job names MPI's launcher (a Volcano mpi plugin's ``--master`` task); and with
``--frameworks mpi`` every training pod too (DeepSpeed runs mpirun from a training pod). The rule reads only the
pod's own role, the job's naming and the setting, so a pod never gains or loses the file while it lives.
"""

from __future__ import annotations

from agent.core.files.frameworks import LAUNCHER_ROLE
from agent.core.files.frameworks.base import Context, Framework, Port, role_map
from agent.core.files.rendering import hosts_lines
from agent.core.files.variables import Variable


class Mpi(Framework):
    key, title, env_file = "mpi", "MPI (OpenMPI, Intel MPI, MPICH)", "mpi.env"
    other_files = ("hydra_hostfile",)
    recipients = "the pods of role 'launcher' or of a Volcano mpi plugin's --master task and, with --frameworks " \
                 "mpi, every training pod"
    has_port = False
    needs_every_member = True  # it names the hostfile, which a --view own pod does not write

    def refusal(self, ctx: Context) -> str | None:
        me = ctx.me
        if (role_map(ctx, self.key) or {}).get(me.role, me.role) == LAUNCHER_ROLE \
                or (me.training and self.key in ctx.asked):
            return None
        why = "not a training pod" if not me.training else f"--frameworks does not name {self.key}"
        return f"role '{me.role}' is not the launcher, and {why}; {self.env_file} goes to {self.recipients}"

    def blocked(self, ctx: Context, port: Port | None) -> str | None:
        if not ctx.topology.training:
            return "the job has no training pod: the hostfile is empty"
        return super().blocked(ctx, port)

    def variables(self, ctx: Context, port: Port | None) -> list[Variable]:
        topo = ctx.topology
        hostfile, hydra = ctx.path("hostfile"), ctx.path("hydra_hostfile")
        out = [
            Variable("OMPI_MCA_orte_default_hostfile", hostfile, "the hostfile (OpenMPI 4, ORTE)"),
            Variable("PRTE_MCA_prte_default_hostfile", hostfile, "the hostfile (OpenMPI 5, PRTE: it ignores the "
                     "ORTE name)"),
        ]
        if len(topo.slot_sizes) == 1:
            slots = str(next(iter(topo.slot_sizes)))
            out += [Variable("OMPI_MCA_orte_set_default_slots", slots, "NPROC_PER_NODE of every training pod"),
                    Variable("PRTE_MCA_prte_set_default_slots", slots, "NPROC_PER_NODE of every training pod")]
        out += [
            Variable("OMPI_MCA_orte_keep_fqdn_hostnames", "true", "the hostfile's names as written (as the MPI "
                     "operator sets it)"),
            Variable("PRTE_MCA_prte_keep_fqdn_hostnames", "false", "PRTE with true treats the launcher's own short "
                     "name as a remote host (kubeflow/trainer PR #4029)"),
            Variable("I_MPI_HYDRA_HOST_FILE", hydra, "host:slots per training pod (Intel MPI's Hydra)"),
            Variable("HYDRA_HOST_FILE", hydra, "host:slots per training pod (MPICH's Hydra)"),
        ]
        return out

    def extra_files(self, ctx: Context, port: Port | None) -> dict[str, bytes]:
        return {"hydra_hostfile": hosts_lines(ctx.topology, ":{}").encode()}


MPI = Mpi()
