// Logs and timeline pieces that need no communicator: RINGREDUCE_DEBUG_SUBSYS's parsing and
// filtering, RINGREDUCE_DEBUG_FILE's substitutions, the timestamped line format, the warning for
// unknown RINGREDUCE_* variables, and the timeline's file names and JSON (checked by Python's
// json module, also for a file cut short before the communicator's destruction).
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/config.h"
#include "core/log.h"
#include "core/timeline.h"

namespace rc = ringreduce::core;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A directory of its own, removed with what is in it.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/rr_observe_XXXXXX";
    path = mkdtemp(tmpl);
  }
  ~TempDir() {
    const std::string cmd = "rm -rf '" + path + "'";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
};

// Runs a Python snippet on `path`; its exit status.
int python_on(const std::string& code, const std::string& path) {
  const std::string cmd = "python3 -c '" + code + "' '" + path + "'";
  return std::system(cmd.c_str());
}

uint32_t bit(rc::LogSubsys s) {
  return 1u << static_cast<uint32_t>(s);
}

}  // namespace

TEST(LogSubsys, ParsesListsExclusionsAndAll) {
  uint32_t m = 0;
  std::string why;
  ASSERT_TRUE(rc::parse_log_subsys("init,COLL", &m, &why));
  EXPECT_EQ(m, bit(rc::LogSubsys::init) | bit(rc::LogSubsys::coll));
  const uint32_t all = (1u << rc::kNumLogSubsys) - 1;
  ASSERT_TRUE(rc::parse_log_subsys("ALL", &m, &why));
  EXPECT_EQ(m, all);
  ASSERT_TRUE(rc::parse_log_subsys("^net, shm", &m, &why));
  EXPECT_EQ(m, all & ~(bit(rc::LogSubsys::net) | bit(rc::LogSubsys::shm)));
  ASSERT_TRUE(rc::parse_log_subsys("", &m, &why));
  EXPECT_EQ(m, all);
  EXPECT_FALSE(rc::parse_log_subsys("init,bogus", &m, &why));
  EXPECT_NE(why.find("'bogus' is not a subsystem"), std::string::npos) << why;
  EXPECT_NE(why.find("store"), std::string::npos) << why;  // lists the known ones
}

TEST(LogFile, SubstitutesHostAndPid) {
  EXPECT_EQ(rc::expand_log_path("/tmp/rr.%h.%p.log", "node7", 4242), "/tmp/rr.node7.4242.log");
  EXPECT_EQ(rc::expand_log_path("a%%b%x%", "h", 1), "a%b%x%");
}

TEST(LogFile, FiltersBySubsystemKeepsWarningsAndStampsTime) {
  TempDir dir;
  const std::string path = dir.path + "/log.txt";
  rc::set_log_file(path);
  rc::set_log_level(rc::LogLevel::info);
  rc::set_log_subsys_mask(bit(rc::LogSubsys::init));
  RR_LOG(info, init, 3, "shown: init");
  RR_LOG(info, net, 3, "hidden: net info");
  RR_LOG(trace, init, 3, "hidden: above the level");
  RR_LOG(warn, net, 3, "shown: net warning");
  rc::set_log_subsys_mask(~0u);
  rc::set_log_level(rc::LogLevel::warn);
  rc::set_log_file("");
  const std::string text = slurp(path);
  EXPECT_NE(text.find("INFO shown: init"), std::string::npos) << text;
  EXPECT_NE(text.find("WARN shown: net warning"), std::string::npos) << text;
  EXPECT_EQ(text.find("hidden"), std::string::npos) << text;
  const std::regex line(
      R"(\[ringreduce \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6} [^ :]+:\d+ rank 3\] INFO shown: init)");
  EXPECT_TRUE(std::regex_search(text, line)) << text;
}

TEST(UnknownVariables, NamesEachWithTheNearestSetting) {
  const std::vector<std::string> env = {"PATH=/usr/bin",
                                        "RINGREDUCE_TIMEOT=3",
                                        "RINGREDUCE_TIMEOUT=5",
                                        "RINGREDUCE_LOCAL_RANK=0",
                                        "RINGREDUCE_BUILD=/b",
                                        "RINGREDUCE_DEBUG_SUBSYSTEM=init",
                                        "RINGREDUCE_COMPLETELY_DIFFERENT=1"};
  const std::vector<std::string> lines = rc::unknown_variables(env);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0],
            "RINGREDUCE_TIMEOT is not a ringreduce setting; did you mean RINGREDUCE_TIMEOUT?");
  EXPECT_EQ(lines[1],
            "RINGREDUCE_DEBUG_SUBSYSTEM is not a ringreduce setting; did you mean "
            "RINGREDUCE_DEBUG_SUBSYS?");
  EXPECT_EQ(lines[2],
            "RINGREDUCE_COMPLETELY_DIFFERENT is not a ringreduce setting; the settings are listed "
            "in README.md");
  // Every registered setting is known (the list is the registry's, not a copy).
  for (const auto& s : rc::all_settings())
    EXPECT_TRUE(rc::unknown_variables({std::string(s.name) + "=x"}).empty()) << s.name;
}

TEST(Timeline, FileNames) {
  EXPECT_EQ(rc::Timeline::file_name("/tmp/tl", 3, "h", 9, 0), "/tmp/tl.3.json");
  EXPECT_EQ(rc::Timeline::file_name("/tmp/tl.json", 3, "h", 9, 0), "/tmp/tl.3.json");
  EXPECT_EQ(rc::Timeline::file_name("/tmp/%h-%p-r%r.json", 3, "node", 9, 0), "/tmp/node-9-r3.json");
  EXPECT_EQ(rc::Timeline::file_name("/tmp/tl", 0, "h", 9, 2), "/tmp/tl.0.comm2.json");
}

TEST(Timeline, WritesStrictJsonAndATruncatedFileStillReads) {
  TempDir dir;
  const std::string pattern = dir.path + "/tl";
  const std::string path = pattern + ".1.json";
  {
    rc::Timeline tl(pattern, 1, 2, 0);
    EXPECT_EQ(tl.path(), path);
    const double t0 = rc::Timeline::now_us();
    tl.op_begin(7);
    tl.phase("reduce-scatter");
    tl.wait(t0 + 1, t0 + 2, 0, true);
    tl.phase("allgather");
    EXPECT_EQ(tl.op_end(), 7u);
    tl.complete("op", "allreduce", t0, rc::Timeline::now_us() + 1,
                "\"seq\":7,\"algorithm\":\"ring seg=512K ch=1\"");
    tl.async_span("p2p", "send", 0x42, t0, t0 + 3, "\"peer\":0");
    tl.flush();
    // Killed here: no closing bracket, a trailing comma. json.loads fails; the merge tool's rule
    // (cut after the last complete event, close the array) reads every event.
    EXPECT_EQ(python_on("import json,sys; t=open(sys.argv[1]).read(); "
                        "assert not t.rstrip().endswith(\"]\"); "
                        "e=json.loads(t[:t.rstrip().rfind(\"}\")+1]+\"]\"); "
                        "assert len(e)==8, len(e)",
                        path),
              0);
  }
  // Closed: strict JSON, the expected events, phases inside the op, the wait inside the first.
  EXPECT_EQ(
      python_on("import json,sys; e=json.load(open(sys.argv[1])); "
                "n={(x.get(\"cat\"),x[\"name\"]) for x in e}; "
                "assert (\"phase\",\"reduce-scatter\") in n and (\"phase\",\"allgather\") in n; "
                "assert (\"wait\",\"wait rank 0\") in n and (\"op\",\"allreduce\") in n; "
                "m=[x for x in e if x[\"name\"]==\"process_name\"][0]; "
                "assert m[\"args\"][\"name\"]==\"rank 1\" and m[\"pid\"]==1; "
                "assert \"realtime_minus_monotonic_us\" in m[\"args\"]; "
                "op=[x for x in e if x.get(\"cat\")==\"op\"][0]; "
                "ph=[x for x in e if x.get(\"cat\")==\"phase\"]; "
                "assert all(op[\"ts\"]<=p[\"ts\"] and p[\"ts\"]+p[\"dur\"]<=op[\"ts\"]+op[\"dur\"]"
                " for p in ph); assert op[\"args\"][\"seq\"]==7",
                path),
      0);
}
