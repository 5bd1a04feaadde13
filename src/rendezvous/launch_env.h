// Who am I and where is the store? The launchers' variable chain (docs/ARCHITECTURE.md), first
// match wins:
//   RINGREDUCE_RANK / RINGREDUCE_WORLD_SIZE / RINGREDUCE_ADDR      (ringrun, or by hand)
//   RANK / WORLD_SIZE / MASTER_ADDR:MASTER_PORT                     (torchrun)
//   OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE                     (OpenMPI's mpirun)
//   SLURM_PROCID / SLURM_NTASKS                                     (srun)
//   PMI_RANK / PMI_SIZE                                             (MPICH hydra, PMI)
// The store address comes from RINGREDUCE_ADDR, else MASTER_ADDR:MASTER_PORT; under mpirun/srun
// the user exports one of them (README shows how). Where MASTER_ADDR:MASTER_PORT is torchrun's
// agent store (TORCHELASTIC_USE_AGENT_STORE=True), the store there is torch's TCPStore, hosted by
// torchrun's agent: the ranks use it as clients (torch_store.h) and rank 0 hosts none.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/config.h"
#include "core/security.h"
#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

struct LaunchInfo {
  int rank = -1;
  int world_size = -1;
  std::string store_host;  // empty if no address was found
  int store_port = -1;
  // The store at the address is torchrun's agent store (torch's TCPStore), not one to host.
  bool torch_store = false;
  int local_rank = -1;  // -1 when the launcher does not say
  int local_size = -1;
  std::string launcher;  // "ringreduce", "torchrun", "openmpi", "slurm", "pmi", "options"
};

// Reads the resolved config (Options override the RINGREDUCE_* variables) and then the
// launchers' variables. Throws InvalidArgument naming the variables it looked for when rank or
// world size cannot be found, or when they are inconsistent (rank >= world size, ...).
LaunchInfo detect_launch(const core::Config& config);

// What a process that could not start can still tell, each part if it can be read: the rank its
// launcher gave it (the text, unchecked) to name it in the error, and the store's address to mark
// the job failed there, so that the other ranks learn it at once. Never throws.
struct LaunchHints {
  std::optional<std::string> rank;
  std::string store_host;
  int store_port = -1;
  bool torch_store = false;
};
LaunchHints launch_hints(const core::Config& config) noexcept;

// A client of the store at host:port: torch's TCPStore protocol where torch_store (the token and
// RINGREDUCE_ENCRYPT cannot apply: torch's store authenticates and encrypts nothing), else
// ringreduce's, protected as `security` says.
std::shared_ptr<Store> connect_store(const std::string& host, int port, bool torch_store,
                                     std::chrono::milliseconds timeout,
                                     const core::Security& security);

// The job's own namespace in the store: RINGREDUCE_JOB_ID, else the launcher's job id
// (torchrun's TORCHELASTIC_RUN_ID, Slurm's
// SLURM_JOB_ID.SLURM_STEP_ID, Open MPI's OMPI_MCA_ess_base_jobid), else "" (none: a store reused by
// two jobs is then refused at their claims, rendezvous/join.h).
std::string job_id(const core::Config& config);

// Launched by torchrun, whose store outlives its worker groups (a restart, an elastic round):
// each group joins under a generation of its own (first_free_generation, join.h).
bool rounds_share_store();

}  // namespace ringreduce::rendezvous
