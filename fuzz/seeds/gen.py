#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/corpus/<target>/) from the repository's docs, examples and
tests, sushy-tools' Redfish templates (when a venv with sushy-tools and Jinja2 runs this) and
the hand-written requests in fuzz/seeds/*.txt. Run from the repository root:
`python3 fuzz/seeds/gen.py`. Seeds are named by content hash, as libFuzzer names its finds."""
import glob
import hashlib
import json
import os
import re
import sys

ROOT = os.getcwd()
OUT = os.path.join(ROOT, "fuzz", "corpus")


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    if not data.strip() or len(data) > 16384:
        return
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def fenced(text):
    """(language, body) of every fenced block of a Markdown text."""
    return re.findall(r"```([a-z]*)\n(.*?)```", text, re.S)


def rust_strings(text):
    """String literals of a Rust source (raw and plain, escapes of plain ones undone)."""
    out = [m.group(2) for m in re.finditer(r'r(#+)"(.*?)"\1', text, re.S)]
    for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', text, re.S):
        s = m.group(1)
        s = re.sub(r"\\\n\s*", "", s)
        s = s.replace('\\n', '\n').replace('\\t', '\t').replace('\\"', '"').replace('\\\\', '\\')
        out.append(s)
    return out


def docs_and_tests():
    for md in glob.glob("docs/**/*.md", recursive=True) + glob.glob("crates/**/*.md", recursive=True):
        for lang, body in fenced(read(md)):
            route(md, lang, body)
    for rs in glob.glob("crates/**/*.rs", recursive=True):
        for s in rust_strings(read(rs)):
            route(rs, "", s)
    for toml in glob.glob("crates/providers/sim/examples/*.toml"):
        put("sim_config", read(toml))


def route(src, lang, body):
    if "[Global]" in body or "[global]" in body:
        put("cloud_gcfg", body)
        if "aws" in src:
            put("aws_config", body)
        if "openstack" in src:
            put("openstack_config", body.replace("use-clouds", "# use-clouds"))
    if "LeaderMigrationConfiguration" in body:
        put("leader_migration", body)
    if re.search(r"^clouds:", body, re.M):
        put("openstack_clouds_yaml", body)
    if "kind: Config" in body and "clusters:" in body:
        put("kubeconfig", body)
    if lang == "toml" or (lang == "" and re.search(r"^\[\[?[a-z_.]+\]\]?$", body, re.M) and "=" in body):
        if "metal" in src and ("machines" in body or "pools" in body or "routes" in body):
            put("metal_config", body)
        if "sim" in src and ("instances" in body or "latency" in body or "error_rate" in body):
            put("sim_config", body)
        if "aws" in src and "[Global]" not in body and "=" in body:
            put("aws_config", body)
    annotations = re.findall(r"^\s*((?:service\.beta\.kubernetes\.io|metallb\.universe\.tf|metallb\.io|kube-vip\.io)/[a-z0-9.-]+):\s*(.*)$", body, re.M)
    if annotations:
        lines = "\n".join(f"{k}={v.strip().strip(chr(34))}" for k, v in annotations)
        if "aws" in "".join(k for k, _ in annotations):
            put("aws_annotations", lines)
        else:
            put("metal_annotations", lines)


def annotation_keys():
    """One seed per annotation key the providers read, with a typical value."""
    values = ["true", "false", "10", "nlb", "internal", "tcp", "http", "ssl", "443,8443", "*",
              "a=b,c=d", "10.0.0.0/8,192.168.0.0/16", "192.0.2.10", "192.0.2.10,2001:db8::10",
              "pool-a", "key-1", "dualstack", "ip", "instance", "subnet-1,subnet-2", "sg-1",
              "arn:aws:acm:us-east-1:123456789012:certificate/abc", "ELBSecurityPolicy-2016-08",
              "preserve_client_ip.enabled=true"]
    aws = set(re.findall(r'"(service\.beta\.kubernetes\.io/aws-load-balancer-[a-z0-9-]+)"', read("crates/providers/aws/src/annotations.rs")))
    for k in sorted(aws):
        for v in values[:: max(1, len(values) // 6)]:
            put("aws_annotations", f"{k}={v}\n")
    metal = set()
    for rs in glob.glob("crates/providers/metal/src/**/*.rs", recursive=True):
        metal |= set(re.findall(r'"((?:metallb\.universe\.tf|metallb\.io|kube-vip\.io)/[a-zA-Z0-9.-]+)"', read(rs)))
    for k in sorted(metal):
        for v in values[10:16]:
            put("metal_annotations", f"{k}={v}\n")
    for v in ["192.0.2.10", "2001:db8::1", "192.0.2.10,2001:db8::1", "10.0.0.0/8", ""]:
        put("metal_annotations", f"spec.loadBalancerIP={v}\n")
    lbopts = read("crates/providers/openstack/src/lbopts.rs")
    openstack = sorted(set(re.findall(r'^\s+\(?"([a-z0-9-]+)",', lbopts, re.M)))
    os_values = ["true", "false", "yes", "10", "-1", "5s", "ROUND_ROBIN", "public-*", "~pub.*",
                 "!~(", "&a,b", "!a", "internet", "lb.example.com", "1.2.3.4", "https://barbican/x"]
    for k in openstack:
        for v in os_values[:: max(1, len(os_values) // 5)]:
            put("openstack_annotations", f"{k}={v}\n")
            put("openstack_annotations", f"conf.{k}={v}\n")
    put("openstack_annotations", 'conf.class "internet" floating-network-id=inet\nclass=internet\n'
        'floating-subnet=public-*\nspec.loadBalancerSourceRanges=10.0.0.0/8,2001:db8::/32\n'
        'spec.healthCheckNodePort=32000\n')
    put("openstack_annotations", "conf.lb-provider=ovn\nx-forwarded-for=true\nkeep-floatingip=yes\n"
        "default-tls-container-ref=https://barbican/x\nconf.manage-security-groups=true\n")


def sushy():
    try:
        import jinja2
        import sushy_tools
    except ImportError:
        print("sushy-tools / Jinja2 not importable: no Redfish template seeds", file=sys.stderr)
        return
    tdir = os.path.join(os.path.dirname(sushy_tools.__file__), "emulator", "templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(tdir))
    ctx = dict(identity="1", name="node-1", uuid="38947555-7742-3448-3784-823347823834",
               power_state="On", feature_set="full", system_collection=["1"],
               systems=["1"], manager_count=1, chassis_count=1, managers=["BMC"], chassis=["1"],
               boot_source_target="Pxe", boot_source_mode="UEFI", total_memory_gb=4,
               total_cpus=2, indicator_led="Off", uefi_mode=True, secure_boot=False)
    for name, pick in [("root.json", 0), ("system_collection.json", 1), ("system.json", 2),
                       ("error.json", 2)]:
        try:
            text = env.get_template(name).render(**ctx)
            json.loads(text)
        except Exception as e:  # a template this context does not fill
            print(f"{name}: {e}", file=sys.stderr)
            continue
        for status in range(6):
            put("metal_redfish", bytes([pick | status << 2]) + text.encode())


def hand_written():
    for path in glob.glob("fuzz/seeds/*.txt"):
        target = os.path.basename(path).split(".")[0]
        for seed in read(path).split("\n%%\n"):
            if seed.startswith("\\x"):
                put(target, bytes([int(seed[2:4], 16)]) + seed[4:].encode())
            else:
                put(target, seed)


docs_and_tests()
annotation_keys()
sushy()
hand_written()
for d in sorted(os.listdir(OUT)):
    print(d, len(os.listdir(os.path.join(OUT, d))))
