// Certificates for the tests of RINGREDUCE_ENCRYPT=tls (tests/unit/tls_keys_test.cc,
// tests/inprocess/encrypt_test.cc), made once per test process with the openssl CLI in a
// temporary directory and removed afterwards: a CA; "server", "client" and "rank" leaves signed
// by it; "stranger", signed by another CA; "expired", signed by the CA with dates in 2020.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

namespace rrtest {

constexpr const char* kOpenssl = "/usr/bin/openssl";

// Subject names and extensions for the CA and the leaves, and a minimal `openssl ca` setup: the
// expired certificate needs dates in the past, which only `openssl ca` sets in OpenSSL 3.0.
constexpr const char* kConfig = R"(
[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[v3_leaf]
basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
[ca]
default_ca = ca_default
[ca_default]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = policy_any
unique_subject = no
[policy_any]
commonName = supplied
)";

class TestCerts {
 public:
  // Makes them (once); false if the openssl CLI is missing or failed (its output on stderr).
  static bool make() {
    if (dir_) return ok_;
    if (::access(kOpenssl, X_OK) != 0) return false;
    char tmpl[] = "/tmp/rr-tls-test-XXXXXX";
    if (!::mkdtemp(tmpl)) return false;
    dir_ = new std::string(tmpl);
    std::ofstream(*dir_ + "/openssl.cnf") << kConfig;
    std::ofstream(*dir_ + "/index.txt");
    std::ofstream(*dir_ + "/serial") << "1000\n";
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    ok_ = openssl("req -x509 -config openssl.cnf -extensions v3_ca" + ec +
                  " -keyout ca.key -out ca.crt -days 2 -subj /CN=ringreduce-test-ca") &&
          openssl("req -x509 -config openssl.cnf -extensions v3_ca" + ec +
                  " -keyout other-ca.key -out other-ca.crt -days 2 -subj /CN=another-ca") &&
          leaf("server", "ca", 2) && leaf("client", "ca", 3) && leaf("stranger", "other-ca", 4) &&
          leaf("rank", "ca", 5) &&
          openssl("req -new -config openssl.cnf" + ec +
                  " -keyout expired.key -out expired.csr -subj /CN=expired") &&
          openssl(
              "ca -config openssl.cnf -batch -notext -extensions v3_leaf -cert ca.crt"
              " -keyfile ca.key -startdate 20200101000000Z -enddate 20200102000000Z"
              " -in expired.csr -out expired.crt");
    return ok_;
  }
  static void remove() {
    if (dir_) std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
    ok_ = false;
  }
  static bool have_openssl() { return ::access(kOpenssl, X_OK) == 0; }
  static std::string path(const std::string& f) { return *dir_ + "/" + f; }
  static bool openssl(const std::string& args) {
    const std::string cmd =
        "cd " + *dir_ + " && timeout 60 " + kOpenssl + " " + args + " > openssl.log 2>&1";
    if (std::system(cmd.c_str()) == 0) return true;
    std::ifstream log(*dir_ + "/openssl.log");
    std::cerr << "failed: " << cmd << "\n" << log.rdbuf() << "\n";
    return false;
  }

 private:
  static bool leaf(const std::string& name, const std::string& ca, int serial) {
    const std::string ec = " -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    return openssl("req -new -config openssl.cnf" + ec + " -keyout " + name + ".key -out " + name +
                   ".csr -subj /CN=" + name) &&
           openssl("x509 -req -in " + name + ".csr -CA " + ca + ".crt -CAkey " + ca +
                   ".key -set_serial " + std::to_string(serial) +
                   " -days 2 -extfile openssl.cnf -extensions v3_leaf -out " + name + ".crt");
  }
  static inline std::string* dir_ = nullptr;
  static inline bool ok_ = false;
};

}  // namespace rrtest
