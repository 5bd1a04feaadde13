// detect_launch: every launcher's variables, the precedence between launchers, and clear
// InvalidArgument messages for missing, half-set or garbage values. The tests set the
// environment of this process (setenv/unsetenv); the library itself reads it only through
// core::env and core::Config.
#include <stdlib.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "rendezvous/launch_env.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

// Every variable detect_launch may look at. Each test starts with all of them unset and the
// fixture puts the process's original values back afterwards.
const std::vector<std::string> kVariables = {
    "RINGREDUCE_RANK",
    "RINGREDUCE_WORLD_SIZE",
    "RINGREDUCE_ADDR",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NODEID",
    "PMI_RANK",
    "PMI_SIZE",
    "MPI_LOCALRANKID",
    "MPI_LOCALNRANKS",
};

class LaunchEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& name : kVariables) {
      if (const char* v = ::getenv(name.c_str())) saved_[name] = v;
      ::unsetenv(name.c_str());
    }
  }
  void TearDown() override {
    for (const auto& name : kVariables) {
      auto it = saved_.find(name);
      if (it != saved_.end())
        ::setenv(name.c_str(), it->second.c_str(), 1);
      else
        ::unsetenv(name.c_str());
    }
  }

  static void set(const std::string& name, const std::string& value) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  static void unset(const std::string& name) { ::unsetenv(name.c_str()); }

  // A fresh Config, so that it sees the environment as the test has just set it.
  static LaunchInfo detect(const std::map<std::string, std::string>& options = {}) {
    return detect_launch(core::Config(options));
  }

  // The InvalidArgument message detect_launch gives now; fails the test if it does not throw.
  static std::string error_message(const std::map<std::string, std::string>& options = {}) {
    try {
      LaunchInfo info = detect(options);
      ADD_FAILURE() << "expected InvalidArgument, got rank " << info.rank << " of "
                    << info.world_size << " from " << info.launcher;
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "";
  }

  std::map<std::string, std::string> saved_;
};

#define EXPECT_MENTIONS(text, needle) \
  EXPECT_NE((text).find(needle), std::string::npos) << "message: " << (text)

TEST_F(LaunchEnvTest, RingreduceVariables) {
  set("RINGREDUCE_RANK", "2");
  set("RINGREDUCE_WORLD_SIZE", "4");
  set("RINGREDUCE_ADDR", "node0:29500");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.store_host, "node0");
  EXPECT_EQ(info.store_port, 29500);
  EXPECT_EQ(info.local_rank, -1);
  EXPECT_EQ(info.local_size, -1);
  EXPECT_EQ(info.launcher, "ringreduce");
}

TEST_F(LaunchEnvTest, OptionsOverrideTheEnvironment) {
  set("RINGREDUCE_RANK", "1");
  set("RINGREDUCE_WORLD_SIZE", "4");
  set("RINGREDUCE_ADDR", "envhost:1");
  LaunchInfo info = detect({{"RINGREDUCE_RANK", "3"}, {"RINGREDUCE_ADDR", "[::1]:2345"}});
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.store_host, "::1");
  EXPECT_EQ(info.store_port, 2345);
  EXPECT_EQ(info.launcher, "options");
  // Options alone, with nothing in the environment.
  unset("RINGREDUCE_RANK");
  unset("RINGREDUCE_WORLD_SIZE");
  info = detect({{"RINGREDUCE_RANK", "0"}, {"RINGREDUCE_WORLD_SIZE", "1"}});
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.launcher, "options");
}

TEST_F(LaunchEnvTest, Torchrun) {
  set("RANK", "5");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "4");
  set("MASTER_ADDR", "10.1.2.3");
  set("MASTER_PORT", "29400");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.store_host, "10.1.2.3");
  EXPECT_EQ(info.store_port, 29400);
  EXPECT_EQ(info.launcher, "torchrun");
}

TEST_F(LaunchEnvTest, TorchrunWithAnIPv6MasterAddress) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "fd00::1");
  set("MASTER_PORT", "29500");
  EXPECT_EQ(detect().store_host, "fd00::1");
  set("MASTER_ADDR", "[fd00::2]");
  EXPECT_EQ(detect().store_host, "fd00::2");
}

TEST_F(LaunchEnvTest, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "16");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "3");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "8");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 16);
  EXPECT_EQ(info.local_rank, 3);
  EXPECT_EQ(info.local_size, 8);
  EXPECT_EQ(info.launcher, "openmpi");
  // Under mpirun the user exports the store address.
  EXPECT_TRUE(info.store_host.empty());
  EXPECT_EQ(info.store_port, -1);
}

TEST_F(LaunchEnvTest, Slurm) {
  set("SLURM_PROCID", "6");
  set("SLURM_NTASKS", "12");
  set("SLURM_LOCALID", "2");
  set("SLURM_NTASKS_PER_NODE", "4");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 6);
  EXPECT_EQ(info.world_size, 12);
  EXPECT_EQ(info.local_rank, 2);
  EXPECT_EQ(info.local_size, 4);
  EXPECT_EQ(info.launcher, "slurm");
  set("SLURM_NTASKS_PER_NODE", "4(x3)");
  EXPECT_EQ(detect().local_size, 4);
}

TEST_F(LaunchEnvTest, SlurmRunLengthTaskCounts) {
  set("SLURM_PROCID", "4");
  set("SLURM_NTASKS", "5");
  set("SLURM_LOCALID", "0");
  // Without --ntasks-per-node srun still sets SLURM_TASKS_PER_NODE.
  set("SLURM_TASKS_PER_NODE", "2(x2),1");
  // Nodes differ and nothing says which node this is: unknown rather than wrong.
  EXPECT_EQ(detect().local_size, -1);
  set("SLURM_NODEID", "2");
  EXPECT_EQ(detect().local_size, 1);
  set("SLURM_NODEID", "1");
  EXPECT_EQ(detect().local_size, 2);
  set("SLURM_NODEID", "3");
  EXPECT_MENTIONS(error_message(), "SLURM_NODEID");
  // SLURM_NTASKS_PER_NODE, when present, is preferred.
  set("SLURM_NTASKS_PER_NODE", "3");
  EXPECT_EQ(detect().local_size, 3);
}

TEST_F(LaunchEnvTest, Pmi) {
  set("PMI_RANK", "0");
  set("PMI_SIZE", "2");
  set("MPI_LOCALRANKID", "0");
  set("MPI_LOCALNRANKS", "2");
  set("RINGREDUCE_ADDR", "head:1234");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(info.world_size, 2);
  EXPECT_EQ(info.local_rank, 0);
  EXPECT_EQ(info.local_size, 2);
  EXPECT_EQ(info.launcher, "pmi");
  EXPECT_EQ(info.store_host, "head");
  EXPECT_EQ(info.store_port, 1234);
}

TEST_F(LaunchEnvTest, FirstMatchWinsInTheDocumentedOrder) {
  set("PMI_RANK", "4");
  set("PMI_SIZE", "10");
  EXPECT_EQ(detect().launcher, "pmi");
  set("SLURM_PROCID", "3");
  set("SLURM_NTASKS", "10");
  EXPECT_EQ(detect().launcher, "slurm");
  set("OMPI_COMM_WORLD_RANK", "2");
  set("OMPI_COMM_WORLD_SIZE", "10");
  EXPECT_EQ(detect().launcher, "openmpi");
  set("RANK", "1");
  set("WORLD_SIZE", "10");
  EXPECT_EQ(detect().launcher, "torchrun");
  set("RINGREDUCE_RANK", "0");
  set("RINGREDUCE_WORLD_SIZE", "10");
  LaunchInfo info = detect();
  EXPECT_EQ(info.launcher, "ringreduce");
  EXPECT_EQ(info.rank, 0);
  EXPECT_EQ(detect({{"RINGREDUCE_RANK", "9"}}).rank, 9);
}

TEST_F(LaunchEnvTest, LocalRankComesFromTheLauncherThatGaveTheRank) {
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  // torchrun's rank, and torchrun sets no local variables here: none are borrowed from OpenMPI.
  LaunchInfo info = detect();
  EXPECT_EQ(info.launcher, "torchrun");
  EXPECT_EQ(info.local_rank, -1);
  EXPECT_EQ(info.local_size, -1);
}

TEST_F(LaunchEnvTest, RingreduceRankTakesLocalRankFromTheLauncherAround) {
  set("RINGREDUCE_RANK", "3");
  set("RINGREDUCE_WORLD_SIZE", "4");
  set("SLURM_LOCALID", "1");
  set("SLURM_NTASKS_PER_NODE", "2");
  LaunchInfo info = detect();
  EXPECT_EQ(info.launcher, "ringreduce");
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_size, 2);
}

TEST_F(LaunchEnvTest, StoreAddressPrecedence) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "master");
  set("MASTER_PORT", "29500");
  set("RINGREDUCE_ADDR", "override:1234");
  LaunchInfo info = detect();
  EXPECT_EQ(info.store_host, "override");
  EXPECT_EQ(info.store_port, 1234);
  unset("RINGREDUCE_ADDR");
  info = detect();
  EXPECT_EQ(info.store_host, "master");
  EXPECT_EQ(info.store_port, 29500);
  // RINGREDUCE_RANK with torchrun's address works too.
  set("RINGREDUCE_RANK", "1");
  set("RINGREDUCE_WORLD_SIZE", "2");
  info = detect();
  EXPECT_EQ(info.launcher, "ringreduce");
  EXPECT_EQ(info.store_host, "master");
}

TEST_F(LaunchEnvTest, WhitespaceAroundNumbersIsTolerated) {
  set("RANK", " 1\n");
  set("WORLD_SIZE", "2 ");
  LaunchInfo info = detect();
  EXPECT_EQ(info.rank, 1);
  EXPECT_EQ(info.world_size, 2);
}

TEST_F(LaunchEnvTest, EmptyVariablesCountAsUnset) {
  set("RANK", "");
  set("WORLD_SIZE", "");
  set("OMPI_COMM_WORLD_RANK", "1");
  set("OMPI_COMM_WORLD_SIZE", "2");
  EXPECT_EQ(detect().launcher, "openmpi");
}

TEST_F(LaunchEnvTest, NothingSetNamesEverythingLookedFor) {
  std::string msg = error_message();
  for (const char* name : {"RINGREDUCE_RANK", "RINGREDUCE_WORLD_SIZE", "RANK", "WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"})
    EXPECT_MENTIONS(msg, name);
}

TEST_F(LaunchEnvTest, HalfSetFamiliesAreErrors) {
  set("RANK", "1");
  EXPECT_MENTIONS(error_message(), "WORLD_SIZE");
  unset("RANK");
  set("RINGREDUCE_RANK", "1");
  EXPECT_MENTIONS(error_message(), "RINGREDUCE_WORLD_SIZE");
  unset("RINGREDUCE_RANK");
  set("RINGREDUCE_WORLD_SIZE", "4");
  EXPECT_MENTIONS(error_message(), "RINGREDUCE_RANK");
  unset("RINGREDUCE_WORLD_SIZE");
  // A world size alone, from a launcher, is not a match; the next family decides.
  set("WORLD_SIZE", "4");
  set("PMI_RANK", "1");
  set("PMI_SIZE", "2");
  EXPECT_EQ(detect().launcher, "pmi");
}

TEST_F(LaunchEnvTest, GarbageNumbersAreErrorsNamingTheVariable) {
  struct Case {
    const char* rank;
    const char* size;
    const char* mentions;
  };
  for (const Case& c : {Case{"abc", "4", "RANK='abc'"}, Case{"-1", "4", "RANK='-1'"},
                        Case{"1.0", "4", "RANK='1.0'"}, Case{"0x1", "4", "RANK='0x1'"},
                        Case{"99999999999", "4", "RANK='99999999999'"},
                        Case{"1", "0", "WORLD_SIZE='0'"}, Case{"1", "four", "WORLD_SIZE='four'"},
                        Case{"4", "4", "not below"}, Case{"7", "4", "not below"}}) {
    set("RANK", c.rank);
    set("WORLD_SIZE", c.size);
    EXPECT_MENTIONS(error_message(), c.mentions);
  }
}

TEST_F(LaunchEnvTest, GarbageRingreduceSettingsSayWhereTheyCameFrom) {
  set("RINGREDUCE_RANK", "x");
  set("RINGREDUCE_WORLD_SIZE", "2");
  std::string msg = error_message();
  EXPECT_MENTIONS(msg, "RINGREDUCE_RANK='x'");
  EXPECT_MENTIONS(msg, "environment");
  msg = error_message({{"RINGREDUCE_RANK", "5"}});
  EXPECT_MENTIONS(msg, "not below");
}

TEST_F(LaunchEnvTest, BadLocalValuesAreErrors) {
  set("RANK", "0");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "4");
  set("LOCAL_WORLD_SIZE", "4");
  EXPECT_MENTIONS(error_message(), "LOCAL_RANK");
  set("LOCAL_RANK", "x");
  EXPECT_MENTIONS(error_message(), "LOCAL_RANK='x'");
  set("LOCAL_RANK", "0");
  set("LOCAL_WORLD_SIZE", "16");
  EXPECT_MENTIONS(error_message(), "LOCAL_WORLD_SIZE");
  unset("RANK");
  unset("WORLD_SIZE");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "4");
  for (const char* bad : {"2(x", "2(y3)", "x(x2)", "2,", "", "0", "2(x0)"}) {
    if (*bad == '\0') continue;  // empty means unset
    set("SLURM_NTASKS_PER_NODE", bad);
    EXPECT_MENTIONS(error_message(), "SLURM_NTASKS_PER_NODE");
  }
}

TEST_F(LaunchEnvTest, BadStoreAddressesAreErrors) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("MASTER_ADDR", "master");
  EXPECT_MENTIONS(error_message(), "MASTER_PORT");
  unset("MASTER_ADDR");
  set("MASTER_PORT", "29500");
  EXPECT_MENTIONS(error_message(), "MASTER_ADDR");
  set("MASTER_ADDR", "master");
  set("MASTER_PORT", "70000");
  EXPECT_MENTIONS(error_message(), "MASTER_PORT='70000'");
  set("MASTER_PORT", "http");
  EXPECT_MENTIONS(error_message(), "MASTER_PORT='http'");
  set("MASTER_PORT", "29500");
  set("MASTER_ADDR", "bad host");
  EXPECT_MENTIONS(error_message(), "MASTER_ADDR");
  unset("MASTER_ADDR");
  unset("MASTER_PORT");
  for (const char* bad : {"nohostport", "host:", "host:abc", "[::1", "a:b:c", "host:0"}) {
    set("RINGREDUCE_ADDR", bad);
    std::string msg = error_message();
    EXPECT_MENTIONS(msg, "RINGREDUCE_ADDR");
    EXPECT_MENTIONS(msg, bad);
  }
}

}  // namespace
}  // namespace ringreduce::rendezvous
