"""The grammars the agent checks pod fields against, no stricter than the API server's: every value a real cluster
can hold is accepted, and every value it refuses is refused.

The cases are the upstream projects' own test cases:

* DNS labels and subdomains: k8s.io/apimachinery pkg/api/validate/content/dns_test.go, TestIsDNS1123Label and
  TestIsDNS1123Subdomain;
* label keys (qualified names) and values: the same package's kube_test.go, TestIsLabelKey and TestIsLabelValue;
* pod IPs: pkg/util/validation/ip_test.go, TestIsValidIP, the ``legacyErr`` column (``status.podIPs`` is a legacy
  field: IsValidIPForLegacyField with ParseIPSloppy)

all at apimachinery commit eed236ceee2c19c2753a3d93ac0631dc20750454; and ParseIPSloppy's own parseIPTests in
k8s.io/utils internal/third_party/forked/golang/net/ip_test.go at commit cf1189d6abe3a7522bbd54a1bc1068a0a56011c8.
"""

from __future__ import annotations

import pytest

from agent import examples
from agent.core import Options, render_pod
from agent.core.pods.validation import (
    canonical_ip,
    check_pod,
    ip_value,
    is_dns1123_label,
    is_dns1123_subdomain,
    is_label_key,
    is_label_value,
    parse_ip,
)
from agent.errors import InputError

LABEL_GOOD = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2", "a" * 63]
LABEL_BAD = ["", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_",
             "_1", "1_2", ".", "a.", ".a", "a.b", "1.", ".1", "1.2", " ", "a ", " a", "a b", "1 ", " 1", "1 2",
             "a" * 64]
SUBDOMAIN_GOOD = ["a", "ab", "abc", "a1", "a-1", "a--1--2--b", "0", "01", "012", "1a", "1-a", "1--a--b--2", "a.a",
                  "ab.a", "abc.a", "a1.a", "a-1.a", "a--1--2--b.a", "a.1", "ab.1", "abc.1", "a1.1", "a-1.1",
                  "a--1--2--b.1", "0.a", "01.a", "012.a", "1a.a", "1-a.a", "1--a--b--2", "0.1", "01.1", "012.1",
                  "1a.1", "1-a.1", "1--a--b--2.1", "a.b.c.d.e", "aa.bb.cc.dd.ee", "1.2.3.4.5", "11.22.33.44.55",
                  "a" * 253]
SUBDOMAIN_BAD = ["", "A", "ABC", "aBc", "A1", "A-1", "1-A", "-", "a-", "-a", "1-", "-1", "_", "a_", "_a", "a_b", "1_",
                 "_1", "1_2", ".", "a.", ".a", "a..b", "1.", ".1", "1..2", " ", "a ", " a", "a b", "1 ", " 1", "1 2",
                 "A.a", "aB.a", "ab.A", "A1.a", "a1.A", "A.1", "aB.1", "A1.1", "1A.1", "0.A", "01.A", "012.A", "1A.a",
                 "1a.A", "A.B.C.D.E", "AA.BB.CC.DD.EE", "a.B.c.d.e", "aa.bB.cc.dd.ee", "a@b", "a,b", "a_b", "a;b",
                 "a:b", "a%b", "a?b", "a$b", "a" * 254]
KEY_GOOD = ["simple", "now-with-dashes", "1-starts-with-num", "1234", "simple/simple", "now-with-dashes/simple",
            "now-with-dashes/now-with-dashes", "now.with.dots/simple", "now-with.dashes-and.dots/simple",
            "1-num.2-num/3-num", "1234/5678", "1.2.3.4/5678", "Uppercase_Is_OK_123", "example.com/Uppercase_Is_OK_123",
            "requests.storage-foo", "a" * 63, "a" * 253 + "/" + "b" * 63]
KEY_BAD = ["nospecialchars%^=@", "cantendwithadash-", "-cantstartwithadash-", "only/one/slash", "Example.com/abc",
           "example_com/abc", "example.com/", "/simple", "a" * 64, "a" * 254 + "/abc"]
VALUE_GOOD = ["simple", "now-with-dashes", "1-starts-with-num", "end-with-num-1", "1234", "a" * 63, ""]
VALUE_BAD = ["nospecialchars%^=@", "Tama-nui-te-rā.is.Māori.sun", "\\backslashes\\are\\bad", "-starts-with-dash",
             "ends-with-dash-", ".starts.with.dot", "ends.with.dot.", "a" * 64]


GRAMMARS = [(is_dns1123_label, LABEL_GOOD, LABEL_BAD), (is_dns1123_subdomain, SUBDOMAIN_GOOD, SUBDOMAIN_BAD),
            (is_label_key, KEY_GOOD, KEY_BAD), (is_label_value, VALUE_GOOD, VALUE_BAD)]
CASES = [(check, value, ok) for check, good, bad in GRAMMARS for values, ok in ((good, True), (bad, False))
         for value in values]


@pytest.mark.parametrize(("check", "value", "valid"), CASES,
                         ids=[f"{c.__name__}-{'ok' if ok else 'refused'}-{v[:20]!r}" for c, v, ok in CASES])
def test_each_grammar_takes_what_apimachinery_takes(check, value, valid):
    assert check(value) is valid


# (input, canonical text the agent writes, or None: refused). From ParseIPSloppy's parseIPTests and TestIsValidIP.
IPS = [
    ("127.0.1.2", "127.0.1.2"), ("127.0.0.1", "127.0.0.1"), ("127.001.002.003", "127.1.2.3"),
    ("127.007.008.009", "127.7.8.9"), ("127.010.020.030", "127.10.20.30"),
    ("::ffff:127.1.2.3", "::ffff:127.1.2.3"), ("::ffff:127.001.002.003", "::ffff:127.1.2.3"),
    ("::ffff:127.007.008.009", "::ffff:127.7.8.9"), ("::ffff:127.010.020.030", "::ffff:127.10.20.30"),
    ("::ffff:7f01:0203", "::ffff:127.1.2.3"), ("0:0:0:0:0000:ffff:127.1.2.3", "::ffff:127.1.2.3"),
    ("0:0:0:0:000000:ffff:127.1.2.3", "::ffff:127.1.2.3"), ("0:0:0:0::ffff:127.1.2.3", "::ffff:127.1.2.3"),
    ("2001:4860:0:2001::68", "2001:4860:0:2001::68"),
    ("2001:4860:0000:2001:0000:0000:0000:0068", "2001:4860:0:2001::68"),
    ("-0.0.0.0", None), ("0.-1.0.0", None), ("0.0.-2.0", None), ("0.0.0.-3", None), ("127.0.0.256", None),
    ("abc", None), ("123:", None), ("fe80::1%lo0", None), ("fe80::1%911", None), ("", None),
    ("a1:a2:a3:a4::b1:b2:b3:b4", None),
    # TestIsValidIP: good, non-canonical but valid, legacy-only valid, and bad values
    ("1.2.3.4", "1.2.3.4"), ("0.0.0.0", "0.0.0.0"), ("255.255.255.255", "255.255.255.255"),
    ("1234::abcd", "1234::abcd"), ("::", "::"), ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                                                 "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
    ("0:0:0:0:0:0:0:0", "::"), ("0001:002:03:4::", "1:2:3:4::"), ("1234::ABCD", "1234::abcd"),
    ("1.1.1.01", "1.1.1.1"), ("::ffff:1.1.1.1", "::ffff:1.1.1.1"),
    ("aaaaaaa", None), ("myhost.mydomain", None), ("1.2.3.0/24", None), ("1.2.3.400", None), ("-1.0.0.0", None),
    ("2001:db8::10005", None), ("1.2.3.4:80", None), ("[2001:db8::1]", None), ("[2001:db8::1]:80", None),
    ("example.com:80", None), ("1234::abcd%eth0", None), ("169.254.0.0%eth0", None),
]


@pytest.mark.parametrize(("raw", "written"), IPS, ids=[repr(r) for r, _ in IPS])
def test_pod_ips_are_read_as_kubernetes_reads_them(raw, written):
    parsed = parse_ip(raw)
    assert (canonical_ip(parsed) if parsed is not None else None) == written
    pod = {"metadata": {"name": "p"}}
    if written is None:
        with pytest.raises(InputError, match="not an IP address"):
            ip_value(pod, raw)
    else:
        assert ip_value(pod, raw) == written


def test_a_jobset_pod_name_longer_than_63_is_a_pod_name():
    """JobSet keeps a pod's hostname within 63 characters; the Job controller adds '-<5 random>' to the pod's name,
    so pods of a JobSet (or TrainJob) with a long name have names of 64-69 characters."""
    name = "a-rather-long-trainjob-name-for-a-nightly-llm-run"  # 49 characters
    pods = examples.jobset(name, (("node", 1, 2),))
    for pod in pods:
        assert len(pod["spec"]["hostname"]) <= 63 < len(pod["metadata"]["name"]) <= 69
        check_pod(pod)
    rendered = render_pod(pods, pods[1]["metadata"]["name"], Options())
    assert rendered.plan.topology.me.address == f"{name}-node-0-1.{name}"
    assert rendered.files["hostfile"].decode().count(f".{name} slots=") == 2


@pytest.mark.parametrize(("field", "value"), [("name", "x" * 254), ("name", "Upper-case"), ("name", "a..b")])
def test_a_pod_name_the_api_server_refuses_is_refused(field, value):
    pod = examples.jobset()[0]
    pod["metadata"][field] = value
    with pytest.raises(InputError, match=r"metadata\.name"):
        check_pod(pod)


def test_a_node_name_of_a_long_label_is_a_node_name():
    pod = examples.jobset()[0]
    pod["spec"]["nodeName"] = "ip-10-0-0-1." + "c" * 70 + ".internal"
    assert check_pod(pod) is pod
