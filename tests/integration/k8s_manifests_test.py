#!/usr/bin/env python3
"""deploy/k8s, validated offline: no API server and no container engine here.

1. Renders the manifests with `kubectl kustomize` from a copy of deploy/k8s whose
   keys/ holds fresh CURVE keypairs made by `archipelago keygen`.
2. Validates every rendered object against its kind's Kubernetes API schema,
   strictly (unknown fields are errors), plus the API server's own rules
   (deploy/k8s/validate/validate.mjs; its npm packages are pinned by
   package-lock.json and installed once per build directory).
3. Checks what no schema can: Services select workloads and name their ports,
   volumes name ConfigMaps and Secrets that exist and hold the files the command
   lines read, the command lines dial the right per-pod DNS names and ports,
   indexes come from the StatefulSet ordinal, the metrics port agrees with the
   Prometheus annotations, replicas agree with mesh.shards / mesh.learners, the
   broker StatefulSet runs the primary and a standby (>= 2 replicas, only pods
   1.. with --standby) kept off one node by a required pod anti-affinity, every
   pod's --broker names the broker pods in ordinal order, every key file a pod
   reads matches the public key its peers look up for it on the allow-list; the
   ConfigMap's TOML with each container's overrides passes `archipelago config`.
4. Checks the Containerfile: Debian 12 stages, sources that exist, runtime
   packages that Debian has (apt-cache) and that cover every library the built
   binary links against, the entrypoint the manifests rely on.
5. Refuses deliberately broken copies, each for the reason planted, so that the
   checks above cannot pass vacuously.
6. Runs the pods' own command lines on loopback, each "pod" on an address of its
   own (127.X.0.N), with its volumes written as the kubelet writes them and the
   downward API's values filled in: the primary broker and its standby, shards and
   two learners form a mesh with CURVE on, /metrics and /status answer, a third
   learner joins (scale up) and leaves again on SIGTERM (scale down); then the
   primary broker's process is SIGKILLed (its node lost): the standby leads in a
   newer epoch (`archipelago status --broker ... --json`), the learners keep
   stepping and merging under it, and after they are scaled away its ledger
   balances and holds exactly the learners' own token counts.

Environment: ARCHIPELAGO (the binary), K8S_VALIDATE_CACHE (where npm installs),
K8S_KEEP=1 keeps the temporary directory (renders, pods' volumes and logs).
"""

import base64
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
K8S = os.path.join(REPO, "deploy", "k8s")
VALIDATE = os.path.join(K8S, "validate")
KEY_NAMES = None  # filled from the kustomization: the keypairs keys/ must hold
POD_INDEX = "metadata.labels['apps.kubernetes.io/pod-index']"
DEADLINE_S = 270  # the whole loopback mesh (events only; the machine may be loaded)
PROGRESS_STEPS = 10  # steps each learner must finish under the standby after the takeover


class Failed(Exception):
    pass


def run(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def need_tool(name, why):
    path = shutil.which(name)
    if not path:
        raise Failed(f"{name} is not installed: {why}")
    return path


# ---- 1. render ---------------------------------------------------------------


def kustomization_keys():
    """The key files the kustomization's generators read from keys/."""
    text = open(os.path.join(K8S, "kustomization.yaml")).read()
    return sorted(set(re.findall(r"^\s*-\s*keys/([A-Za-z0-9._-]+)\s*$", text, re.M)))


def render(binary, tmp, name, mutate=None):
    """A copy of deploy/k8s with fresh keys, rendered; returns the YAML's path."""
    src = os.path.join(tmp, name)
    shutil.copytree(K8S, src, ignore=shutil.ignore_patterns("keys", "validate", "node_modules"))
    keys = os.path.join(src, "keys")
    os.makedirs(keys)
    for stem in sorted({os.path.splitext(f)[0] for f in kustomization_keys()}):
        r = run([binary, "keygen", "--name", stem, "--dir", keys, "--json"])
        if r.returncode != 0:
            raise Failed(f"archipelago keygen --name {stem}: exit {r.returncode}: {r.stderr.strip()}")
    if mutate:
        mutate(src)
    r = run(["kubectl", "kustomize", src])
    if r.returncode != 0:
        raise Failed(f"kubectl kustomize {src}: exit {r.returncode}: {r.stderr.strip()}")
    out = os.path.join(tmp, f"{name}.yaml")
    with open(out, "w") as f:
        f.write(r.stdout)
    return out


# ---- 2. schemas ------------------------------------------------------------------


def validator(cache):
    """npm ci into the cache once per package-lock.json; returns the directory."""
    lock = open(os.path.join(VALIDATE, "package-lock.json"), "rb").read()
    stamp_text = hashlib.sha256(lock + open(os.path.join(VALIDATE, "package.json"), "rb").read()).hexdigest()
    stamp = os.path.join(cache, ".installed")
    os.makedirs(cache, exist_ok=True)
    for f in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(VALIDATE, f), cache)
    if not (os.path.exists(stamp) and open(stamp).read() == stamp_text and os.path.isdir(os.path.join(cache, "node_modules"))):
        r = run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=cache, timeout=300)
        if r.returncode != 0:
            raise Failed(f"npm ci in {cache}: exit {r.returncode}: {r.stderr.strip()[-2000:]}")
        with open(stamp, "w") as f:
            f.write(stamp_text)
    shutil.copy(os.path.join(VALIDATE, "validate.mjs"), cache)  # imports resolve from the cache's node_modules
    return cache


def validate_schema(vdir, files, dump=None):
    """Errors per file (one node process for all of them: its start-up dominates)."""
    cmd = ["node", os.path.join(vdir, "validate.mjs"), *files] + (["--dump", dump] if dump else [])
    r = run(cmd, timeout=120)
    errors = {f: [] for f in files}
    for line in r.stdout.splitlines():
        for f in files:
            if line.startswith(f"error: {f}: "):
                errors[f].append(line[len(f"error: {f}: "):])
    if r.returncode not in (0, 1) or (r.returncode == 1 and not any(errors.values())):
        raise Failed(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
    return errors


# ---- 3. what no schema can check -------------------------------------------------


def flags(args):
    """--flag value pairs of a container's args, and --flag=value ('--set' repeats)."""
    out, sets, i = {}, [], 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            if k == "--set":
                sets.append(v)
            else:
                out[k] = v
            i += 1
        elif a.startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            if a == "--set":
                sets.append(args[i + 1])
            else:
                out[a] = args[i + 1]
            i += 2
        else:
            out[a] = True
            i += 1
    out["--set"] = sets
    return out


def expand(text, env):
    """The kubelet's $(VAR) expansion ($$ escapes)."""
    return re.sub(r"\$\$|\$\(([^)]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


def cli_flag_on(value):
    """How the command-line parser (CLI11) reads a flag given --flag=VALUE: a number > 0, true/on/yes."""
    if value is True:
        return True
    if value is None:
        return False
    text = str(value).strip().lower()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text) > 0
    if text in ("true", "on", "yes", "t", "y", "+"):
        return True
    if text in ("false", "off", "no", "f", "n", "-"):
        return False
    raise ValueError(f"{value!r} is not a flag value")


def curve_key_names(comp, i):
    """transport::curve_key_names: the allow-list names under which peers look up node `comp` `i`."""
    if comp == "broker":
        return ["broker"] if i == 0 else [f"broker-{i}"]
    if comp == "shard":
        return [f"shard-{i}"]
    return [f"learner-{i}", "learner"]


def volume_files(by, vol):
    """The files a ConfigMap or Secret volume shows, as the kubelet projects them: every key, or
    only its `items` at their paths. name -> bytes; None for other volumes."""
    if "configMap" in vol:
        src, data = vol["configMap"], {k: v.encode() for k, v in by.get(("ConfigMap", vol["configMap"]["name"]), {}).get("data", {}).items()}
    elif "secret" in vol:
        src, data = vol["secret"], {k: base64.b64decode(v) for k, v in by.get(("Secret", vol["secret"]["secretName"]), {}).get("data", {}).items()}
    else:
        return None
    if src.get("items") is None:
        return data
    return {item["path"]: data[item["key"]] for item in src["items"] if item["key"] in data}


def pod_env(container, ordinal, ip, pod, namespace):
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
            continue
        path = e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        values = {POD_INDEX: str(ordinal), "status.podIP": ip, "metadata.name": pod, "metadata.namespace": namespace}
        if path not in values:
            raise Failed(f"env {e['name']}: the loopback pods do not provide {path or e.get('valueFrom')}")
        env[e["name"]] = values[path]
    return env


class Mesh:
    """The rendered objects, indexed, and what the mesh's manifests must agree on."""

    def __init__(self, objects):
        self.objects = objects
        self.by = {(o["kind"], o["metadata"]["name"]): o for o in objects}
        self.sts = {}
        for o in objects:
            if o["kind"] == "StatefulSet":
                comp = o["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                self.sts[comp] = o
        cm = self.config_map_of(self.sts.get("broker"), "--config") if "broker" in self.sts else None
        self.toml_text = cm
        self.cfg = tomllib.loads(cm) if cm else {}

    def container(self, comp):
        return self.sts[comp]["spec"]["template"]["spec"]["containers"][0]

    def mount_source(self, sts, path):
        """(volume, key inside it) for a file path a container of `sts` reads."""
        spec = sts["spec"]["template"]["spec"]
        c = spec["containers"][0]
        for m in sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"])):
            mp = m["mountPath"].rstrip("/")
            if path == mp or path.startswith(mp + "/"):
                vol = next((v for v in spec.get("volumes", []) if v["name"] == m["name"]), None)
                if vol is None:
                    vol = next(({"name": t["metadata"]["name"], "claim": True}
                                for t in sts["spec"].get("volumeClaimTemplates", []) if t["metadata"]["name"] == m["name"]), None)
                return vol, path[len(mp) + 1:]
        return None, None

    def file_of(self, sts, path):
        """The content of a file from a ConfigMap or Secret volume (its items honoured), or None."""
        vol, key = self.mount_source(sts, path)
        files = volume_files(self.by, vol) if vol is not None else None
        if files is None or key not in files:
            return None
        return files[key].decode()

    def config_map_of(self, sts, flag):
        path = flags(sts["spec"]["template"]["spec"]["containers"][0].get("args", [])).get(flag)
        return self.file_of(sts, path) if isinstance(path, str) else None


def selects(selector, labels):
    """A Kubernetes label selector against a pod's labels (an absent selector selects nothing)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e.get("key"), e.get("operator"), e.get("values", [])
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels) \
                or op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def anti_affinity_apart(sts):
    """True if the scheduler must keep any two pods of `sts` off one node: a required pod
    anti-affinity term on kubernetes.io/hostname that selects the pods' own labels in their namespace."""
    spec = sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"].get("labels", {})
    terms = (spec.get("affinity") or {}).get("podAntiAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution") or []
    ns = sts["metadata"].get("namespace")
    for t in terms:
        if t.get("topologyKey") != "kubernetes.io/hostname" or not selects(t.get("labelSelector"), labels):
            continue
        if t.get("namespaceSelector") is None and t.get("namespaces") not in (None, []) and ns not in t["namespaces"]:
            continue
        return True
    return False


def cross_check(objects):
    """Problems no schema finds, as a list of sentences."""
    problems = []
    p = problems.append
    mesh = Mesh(objects)
    workloads = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment")]

    for svc in (o for o in objects if o["kind"] == "Service"):
        sel = svc["spec"].get("selector") or {}
        name = svc["metadata"]["name"]
        chosen = [w for w in workloads if sel and all(w["spec"]["template"]["metadata"].get("labels", {}).get(k) == v for k, v in sel.items())]
        if not chosen:
            p(f"Service {name}: its selector {sel} selects no workload")
        for port in svc["spec"].get("ports", []):
            tp = port.get("targetPort", port["port"])
            for w in chosen:
                ports = [cp for c in w["spec"]["template"]["spec"]["containers"] for cp in c.get("ports", [])]
                if not any(cp.get("name") == tp or cp["containerPort"] == tp for cp in ports):
                    p(f"Service {name} port {port.get('name')}: {w['metadata']['name']} has no container port {tp}")

    for w in workloads:
        wname = w["metadata"]["name"]
        spec = w["spec"]["template"]["spec"]
        for v in spec.get("volumes", []):
            for kind, ref, items in (("ConfigMap", v.get("configMap", {}).get("name"), v.get("configMap", {}).get("items")),
                                     ("Secret", v.get("secret", {}).get("secretName"), v.get("secret", {}).get("items"))):
                if ref is None:
                    continue
                obj = mesh.by.get((kind, ref))
                if obj is None:
                    p(f"{wname}: volume {v['name']} needs {kind} {ref}, which the render does not hold")
                    continue
                for item in items or []:
                    if item["key"] not in obj.get("data", {}):
                        p(f"{wname}: volume {v['name']} wants key {item['key']} of {kind} {ref}")
                mode = v.get("secret", v.get("configMap", {})).get("defaultMode", 0o644)
                sc = spec.get("securityContext", {})
                if kind == "Secret" and not mode & 0o004 and sc.get("runAsUser", 0) != 0 and "fsGroup" not in sc:
                    p(f"{wname}: Secret volume {v['name']} (mode {mode:o}, owned by root) is unreadable for "
                      f"runAsUser {sc.get('runAsUser')} without fsGroup")
        if w["kind"] == "StatefulSet":
            svc = mesh.by.get(("Service", w["spec"].get("serviceName")))
            if svc is None or svc["spec"].get("clusterIP") != "None":
                p(f"{wname}: serviceName {w['spec'].get('serviceName')} is not a headless Service of the render")

    for comp in ("broker", "shard", "learner"):
        if comp not in mesh.sts:
            p(f"no StatefulSet with app.kubernetes.io/component={comp}")
    if problems or not mesh.cfg:
        return problems + ([] if mesh.cfg else ["the broker's --config names no file of a ConfigMap volume"])

    m = mesh.cfg.get("mesh", {})
    shards_n, learners_n = m.get("shards", 2), m.get("learners", 4)
    broker, shard, learner = mesh.sts["broker"], mesh.sts["shard"], mesh.sts["learner"]
    brokers_n = broker["spec"].get("replicas", 1)
    if brokers_n < 2:
        p(f"the broker StatefulSet has {brokers_n} replica(s); the mesh runs the primary and a standby (2)")
    if not anti_affinity_apart(broker):
        p(f"{broker['metadata']['name']}: no required pod anti-affinity (topologyKey kubernetes.io/hostname, "
          "selecting the broker pods): the standby could share its primary's node and be lost with it")
    if shard["spec"].get("replicas", 1) != shards_n:
        p(f"the shard StatefulSet has {shard['spec'].get('replicas', 1)} replicas; mesh.shards is {shards_n}")
    if learner["spec"].get("replicas", 1) > learners_n:
        p(f"the learner StatefulSet has {learner['spec'].get('replicas')} replicas; mesh.learners (the most) is {learners_n}")

    def port_of(sts, name):
        c = sts["spec"]["template"]["spec"]["containers"][0]
        return next((cp["containerPort"] for cp in c.get("ports", []) if cp.get("name") == name), None)

    def dns(sts, i):
        return f"tcp://{sts['metadata']['name']}-{i}.{sts['spec']['serviceName']}:{port_of(sts, 'mesh')}"

    want_brokers = ",".join(dns(broker, i) for i in range(max(brokers_n, 1)))
    want_shards = ",".join(dns(shard, i) for i in range(shards_n))
    key_pubs = {}  # name -> public key in the allow-list
    for comp, sts in mesh.sts.items():
        c = sts["spec"]["template"]["spec"]["containers"][0]
        where = f"{sts['metadata']['name']}"
        if "command" in c:
            p(f"{where}: sets command; the image's entrypoint is the archipelago binary and the manifests pass args only")
        args = c.get("args", [])
        f = flags(args)
        if not args or args[0] != "node" or f.get("--role") != comp:
            p(f"{where}: args must start with `node --role {comp}`, not {args[:3]}")
        if f.get("--broker") != want_brokers:
            p(f"{where}: --broker {f.get('--broker')}; the broker pods are at {want_brokers} (primary first)")
        if f.get("--shards") != want_shards:
            p(f"{where}: --shards {f.get('--shards')}; the shard pods are at {want_shards}")
        own = port_of(sts, "mesh")
        env = {e["name"]: e for e in c.get("env", [])}
        listen = f.get("--listen")
        if comp == "learner":
            m_ip = re.fullmatch(r"tcp://\$\((\w+)\):(\d+)", str(listen))
            if not m_ip or env.get(m_ip.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "status.podIP" \
                    or int(m_ip.group(2)) != own:
                p(f"{where}: --listen {listen}; a learner listens on its pod IP (status.podIP) at its mesh port {own}")
        elif listen != f"tcp://0.0.0.0:{own}":
            p(f"{where}: --listen {listen}; it must bind tcp://0.0.0.0:{own} (its mesh port; ZeroMQ binds no DNS name)")
        m_ix = re.fullmatch(r"\$\((\w+)\)", str(f.get("--index")))
        if not m_ix or env.get(m_ix.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != POD_INDEX:
            p(f"{where}: --index {f.get('--index')} must be the pod's ordinal ({POD_INDEX})")
        if comp != "broker" and "--standby" in f:
            p(f"{where}: --standby is a broker's flag only")
        if comp == "broker" and m_ix:
            # Pod 0 the primary (no standby, index 0), pod I >= 1 `--standby --index I`.
            for i in range(brokers_n):
                values = {k: str(i) for k, e in env.items()
                          if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_INDEX}
                standby = f.get("--standby")
                try:
                    on = cli_flag_on(expand(standby, values) if isinstance(standby, str) else standby)
                except ValueError as e:
                    p(f"{where}: pod {i}: --standby: {e}")
                    continue
                if on != (i > 0):
                    p(f"{where}: pod {i} would run {'with' if on else 'without'} --standby; pod 0 is the primary "
                      "and pod I >= 1 the standby `--standby --index I` (e.g. --standby=$(ORDINAL))")
        metrics = port_of(sts, "metrics")
        ann = sts["spec"]["template"]["metadata"].get("annotations", {})
        if metrics is None or str(metrics) != str(f.get("--metrics-port")):
            p(f"{where}: --metrics-port {f.get('--metrics-port')} is not its container port named metrics ({metrics})")
        if ann.get("prometheus.io/scrape") != "true" or ann.get("prometheus.io/port") != str(metrics) \
                or ann.get("prometheus.io/path", "/metrics") != "/metrics":
            p(f"{where}: the prometheus.io annotations {ann} do not point at port {metrics} /metrics")
        if mesh.config_map_of(sts, "--config") != mesh.toml_text:
            p(f"{where}: --config {f.get('--config')} is not the same ConfigMap file as the broker's")
        if comp in ("broker", "shard"):
            vol, _ = mesh.mount_source(sts, str(f.get("--db")))
            if not vol or not vol.get("claim"):
                p(f"{where}: --db {f.get('--db')} is not on a persistent volume (volumeClaimTemplates)")
        key_sets = [s for s in f["--set"] if s.startswith("wire.key_file=")]
        allow = mesh.cfg.get("wire", {}).get("allow", "")
        allow_vol, _ = mesh.mount_source(sts, allow) if allow else (None, None)
        if not allow_vol or "configMap" not in allow_vol:
            p(f"{where}: wire.allow {allow!r} is not a mounted ConfigMap")
        else:
            cm = mesh.by.get(("ConfigMap", allow_vol["configMap"]["name"]), {}).get("data", {})
            for k, text in cm.items():
                got = re.search(r'public\s*=\s*"([^"]+)"', text)
                if k.endswith(".pub") and got:
                    key_pubs[k[:-4]] = got.group(1)
        if mesh.cfg.get("wire", {}).get("curve", True):
            if len(key_sets) != 1:
                p(f"{where}: needs exactly one --set wire.key_file=... (CURVE is on)")
                continue
            replicas = sts["spec"].get("replicas", 1) if comp != "learner" else learners_n
            ordinal_vars = [k for k, e in env.items() if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == POD_INDEX]
            for i in range(replicas):
                path = expand(key_sets[0].split("=", 1)[1], {k: str(i) for k in ordinal_vars})
                text = mesh.file_of(sts, path)
                if text is None:
                    p(f"{where}: pod {i} reads wire.key_file {path}, which no mounted Secret holds")
                    continue
                # The key its peers find for it on the allow-list (the first of its names listed there).
                name = next((n for n in curve_key_names(comp, i) if n in key_pubs), curve_key_names(comp, i)[0])
                pub = re.search(r'public\s*=\s*"([^"]+)"', text)
                if key_pubs and (not pub or key_pubs.get(name) != pub.group(1)):
                    p(f"{where}: pod {i}'s key {path} does not match {name}.pub on the allow-list")
    if mesh.cfg.get("wire", {}).get("curve", True):
        # The names under which nodes find their servers' keys (transport::curve_key_names).
        for names in ([curve_key_names("broker", i) for i in range(brokers_n)]
                      + [curve_key_names("learner", i) for i in range(learners_n)]
                      + [curve_key_names("shard", i) for i in range(shards_n)]):
            if not any(n in key_pubs for n in names):
                p(f"the allow-list has no {names[0]}.pub: peers dialling {names[0]} find no server key")
    return problems


def check_config(binary, mesh, tmp):
    """The ConfigMap's TOML with each container's --set overrides, as `archipelago config` reads it."""
    path = os.path.join(tmp, "archipelago.toml")
    with open(path, "w") as f:
        f.write(mesh.toml_text)
    for comp, sts in mesh.sts.items():
        c = mesh.container(comp)
        env = pod_env(c, 0, "127.0.0.1", f"{sts['metadata']['name']}-0", "default")
        sets = flags([expand(a, env) for a in c.get("args", [])])["--set"]
        cmd = [binary, "config", "--config", path, "--json"] + [a for s in sets for a in ("--set", s)]
        r = run(cmd)
        if r.returncode != 0:
            raise Failed(f"{sts['metadata']['name']}: `archipelago config` refuses the ConfigMap's TOML: {r.stderr.strip()}")
    threads = str(mesh.cfg.get("mesh", {}).get("learner_threads", ""))
    if threads and len(threads.split(",")) != mesh.cfg["mesh"].get("learners", 4):
        raise Failed(f"mesh.learner_threads lists {len(threads.split(','))} values for mesh.learners = {mesh.cfg['mesh']['learners']}")


# ---- 4. Containerfile ---------------------------------------------------------------


def instructions(path):
    text = re.sub(r"\\\n", " ", open(path).read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dpkg_owners(paths):
    """path -> Debian package, from dpkg's file lists (one pass; `dpkg -S` per path is slow)."""
    wanted = {os.path.normpath(p) for p in paths}
    owners = {}
    info = "/var/lib/dpkg/info"
    for name in os.listdir(info):
        if name.endswith(".list"):
            with open(os.path.join(info, name), errors="replace") as f:
                for line in f:
                    if line.rstrip("\n") in wanted:
                        owners[line.rstrip("\n")] = name[:-5].split(":")[0]
    return owners


def needed_packages(binary):
    """Debian packages of the shared libraries the binary links against directly."""
    r = run(["readelf", "-d", binary])
    if r.returncode != 0:
        raise Failed(f"readelf -d {binary}: {r.stderr.strip()}")
    libs = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", r.stdout)
    ldd = run(["ldd", binary]).stdout
    candidates = {}
    for lib in libs:
        m = re.search(rf"^\s*{re.escape(lib)} => (\S+)", ldd, re.M)
        if not m:  # the dynamic loader (NEEDED by position-independent code using TLS): "\t/lib64/ld-linux-x86-64.so.2 (0x...)"
            m = re.search(rf"^\s*(/\S*/{re.escape(lib)}) \(", ldd, re.M)
        if not m:
            raise Failed(f"ldd does not resolve {lib} of {binary}")
        real = os.path.realpath(m.group(1))
        # /lib is a link to /usr/lib on Debian 12: dpkg may list either spelling.
        candidates[lib] = [m.group(1), real] + [p.replace("/usr/lib/", "/lib/", 1) if p.startswith("/usr/lib/")
                                                 else p.replace("/lib/", "/usr/lib/", 1) for p in (m.group(1), real)]
    owners = dpkg_owners([p for c in candidates.values() for p in c])
    packages = {}
    for lib, paths in candidates.items():
        owner = next((owners[os.path.normpath(p)] for p in paths if os.path.normpath(p) in owners), None)
        if owner is None:
            raise Failed(f"no Debian package owns {paths[0]} ({lib})")
        packages[lib] = owner
    return packages


def check_containerfile(binary, mesh):
    path = os.path.join(K8S, "Containerfile")
    ins = instructions(path)
    froms = [rest for word, rest in ins if word == "FROM"]
    if len(froms) != 2 or not re.match(r"(\S*/)?debian:12(\s|$)", froms[0]) or not re.match(r"(\S*/)?debian:12-slim$", froms[1]):
        raise Failed(f"Containerfile: expected a debian:12 build stage and a debian:12-slim run stage, got FROM {froms}")
    for word, rest in ins:
        if word == "COPY" and "--from=" not in rest:
            for src in rest.split()[:-1]:
                if not os.path.exists(os.path.join(REPO, src)):
                    raise Failed(f"Containerfile: COPY {src}: no such path in the repository")
    build_run = " ".join(rest for word, rest in ins if word == "RUN" and "setup.sh" in rest)
    if "tools/setup.sh" not in build_run or "ARCHIPELAGO_TESTS=OFF" not in build_run:
        raise Failed("Containerfile: the build stage must run tools/setup.sh with ARCHIPELAGO_TESTS=OFF")
    if "ARCHIPELAGO_TESTS" not in open(os.path.join(REPO, "tools", "setup.sh")).read():
        raise Failed("tools/setup.sh does not read ARCHIPELAGO_TESTS")
    bdir = re.search(r"BUILD_DIR=(\S+)", build_run)
    copy_bin = next((rest for word, rest in ins if word == "COPY" and "--from=build" in rest), "")
    if not bdir or f"{bdir.group(1)}/archipelago" not in copy_bin:
        raise Failed(f"Containerfile: the run stage copies {copy_bin!r}, not the build's {bdir and bdir.group(1)}/archipelago")
    target = copy_bin.split()[-1]
    entry = next((rest for word, rest in ins if word == "ENTRYPOINT"), "")
    if json.loads(entry or "[]") != [target]:
        raise Failed(f"Containerfile: ENTRYPOINT {entry} is not the copied binary {target}")
    user = next((rest for word, rest in ins if word == "USER"), "")
    uids = {str(s["spec"]["template"]["spec"].get("securityContext", {}).get("runAsUser")) for s in mesh.sts.values()}
    if user.split(":")[0] not in uids or len(uids) != 1:
        raise Failed(f"Containerfile: USER {user} differs from the pods' runAsUser {uids}")
    runtime = " ".join(rest for word, rest in ins if word == "RUN" and "apt-get install" in rest)
    m = re.search(r"apt-get install((?:\s+-\S+)*)\s+(.*?)(?:&&|$)", runtime)
    packages = m.group(2).split() if m else []
    if not packages:
        raise Failed("Containerfile: the run stage installs no Debian packages")
    r = run(["apt-cache", "show", "--no-all-versions", *packages])
    found = set(re.findall(r"^Package: (\S+)", r.stdout, re.M))
    if not found:
        raise Failed("apt-cache knows no packages at all: its lists are empty (run apt-get update)")
    missing = [p for p in packages if p not in found]
    if missing:
        raise Failed(f"Containerfile: Debian has no package {', '.join(missing)} (apt-cache show)")
    needed = needed_packages(binary)
    uncovered = {lib: pkg for lib, pkg in needed.items() if pkg not in packages}
    if uncovered:
        raise Failed(f"Containerfile: the run stage lacks the packages of {uncovered} that the binary links against")
    return packages, needed


# ---- 5. broken copies ----------------------------------------------------------------


def negative_checks(binary, vdir, tmp, rendered, objects):
    text = open(rendered).read()
    planted = [
        ("containerPort: 5557", 'containerPort: "5557"', "containerPort must be integer"),
        ("serviceName: archipelago-learner", "serviceNme: archipelago-learner", "/spec/serviceNme is not a field"),
        ("$(LEARNER_INDEX)\n", "$(LEARNER_IDX)\n", "refers to $(LEARNER_IDX)"),
        ("fieldPath: status.podIP", "fieldPath: status.podIp", "fieldPath 'status.podIp' is not one"),
        ("--standby=$(BROKER_INDEX)", "--standby=$(BROKER_IDX)", "refers to $(BROKER_IDX)"),
        ("requiredDuringSchedulingIgnoredDuringExecution:", "requiredDuringSchedulingIgnoredDuringExecutoin:",
         "/requiredDuringSchedulingIgnoredDuringExecutoin is not a field"),
    ]
    files = []
    for i, (old, new, reason) in enumerate(planted):
        if old not in text:
            raise Failed(f"negative check {i}: the render has no {old!r} to break")
        files.append(os.path.join(tmp, f"broken-{i}.yaml"))
        with open(files[-1], "w") as f:
            f.write(text.replace(old, new, 1))
    errors = validate_schema(vdir, files)
    for f, (old, new, reason) in zip(files, planted):
        if not any(reason in e for e in errors[f]):
            raise Failed(f"negative check: {new!r} was not refused for {reason!r}; errors: {errors[f]}")

    def broken(fn, reason):
        objs = copy.deepcopy(objects)
        fn(objs, {(o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] in ("ConfigMap", "Secret") else o["metadata"]["name"]): o for o in objs})
        problems = cross_check(objs)
        if not any(reason in p for p in problems):
            raise Failed(f"cross-check did not find {reason!r}; it found: {problems}")

    def args_of(by, name):
        return by[("StatefulSet", name)]["spec"]["template"]["spec"]["containers"][0]["args"]

    def set_arg(by, name, flag, value):
        args = args_of(by, name)
        args[args.index(flag) + 1] = value

    def broker_spec(by):
        return by[("StatefulSet", "archipelago-broker")]["spec"]

    def anti_affinity(by):
        return broker_spec(by)["template"]["spec"]["affinity"]["podAntiAffinity"]

    def swap_key_items(by):
        key = next(v for v in broker_spec(by)["template"]["spec"]["volumes"] if v["name"] == "key")
        for item in key["secret"]["items"]:
            item["path"] = {"broker-0.key": "broker-1.key", "broker-1.key": "broker-0.key"}[item["path"]]

    primary, standby = "tcp://archipelago-broker-0.archipelago-broker:5555", "tcp://archipelago-broker-1.archipelago-broker:5555"
    faults = [
        (lambda o, by: by[("Service", "archipelago-shard")]["spec"]["selector"].update({"app.kubernetes.io/component": "shards"}),
         "selects no workload"),
        (lambda o, by: set_arg(by, "archipelago-learner", "--broker", f"{primary[:-1]}4,{standby}"), "archipelago-learner: --broker"),
        # A learner that knows only the primary would never follow the standby.
        (lambda o, by: set_arg(by, "archipelago-learner", "--broker", primary), "archipelago-learner: --broker"),
        # A shard told the brokers in the wrong order would take the standby for the primary.
        (lambda o, by: set_arg(by, "archipelago-shard", "--broker", f"{standby},{primary}"), "archipelago-shard: --broker"),
        (lambda o, by: by[("Secret", "archipelago-shard-keys")]["data"].pop("shard-1.key"), "which no mounted Secret holds"),
        (lambda o, by: by[("StatefulSet", "archipelago-learner")]["spec"].update(replicas=99), "mesh.learners (the most)"),
        (lambda o, by: by[("StatefulSet", "archipelago-shard")]["spec"]["template"]["metadata"]["annotations"]
         .update({"prometheus.io/port": "9000"}), "prometheus.io annotations"),
        # A Secret file that no longer matches its public key on the allow-list.
        (lambda o, by: by[("Secret", "archipelago-broker-keys")]["data"].update(
            {"broker-1.key": by[("Secret", "archipelago-learner-keys")]["data"]["learner-0.key"]}), "does not match broker-1.pub"),
        # Two learner pods with one keypair: learner 3 would present learner 2's identity.
        (lambda o, by: by[("Secret", "archipelago-learner-keys")]["data"].update(
            {"learner-3.key": by[("Secret", "archipelago-learner-keys")]["data"]["learner-2.key"]}),
         "pod 3's key /etc/archipelago/keys/learner-3.key does not match learner-3.pub"),
        (lambda o, by: by[("ConfigMap", "archipelago-allow")]["data"].pop("learner-5.pub"), "no learner-5.pub"),
        # The key volume's items swapped: the standby would present the primary's key.
        (lambda o, by: swap_key_items(by), "pod 1's key /etc/archipelago/keys/broker-1.key does not match broker-1.pub"),
        (lambda o, by: by[("ConfigMap", "archipelago-allow")]["data"].pop("broker-1.pub"), "no broker-1.pub"),
        # Back to one broker: no standby.
        (lambda o, by: broker_spec(by).update(replicas=1), "the primary and a standby"),
        # A third broker pod that no --broker list names.
        (lambda o, by: broker_spec(by).update(replicas=3), "archipelago-learner: --broker"),
        # Both brokers may land on one node: anti-affinity removed, merely preferred, keyed on another topology, or selecting other pods.
        (lambda o, by: broker_spec(by)["template"]["spec"].pop("affinity"), "no required pod anti-affinity"),
        (lambda o, by: anti_affinity(by).update(preferredDuringSchedulingIgnoredDuringExecution=[
            {"weight": 100, "podAffinityTerm": t} for t in anti_affinity(by).pop("requiredDuringSchedulingIgnoredDuringExecution")]),
         "no required pod anti-affinity"),
        (lambda o, by: anti_affinity(by)["requiredDuringSchedulingIgnoredDuringExecution"][0].update(topologyKey="topology.kubernetes.io/rack"),
         "no required pod anti-affinity"),
        (lambda o, by: anti_affinity(by)["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"]
         .update({"app.kubernetes.io/component": "shard"}), "no required pod anti-affinity"),
        # Both pods primaries (no --standby), or both standbys (a bare --standby).
        (lambda o, by: args_of(by, "archipelago-broker").remove("--standby=$(BROKER_INDEX)"), "pod 1 would run without --standby"),
        (lambda o, by: args_of(by, "archipelago-broker").__setitem__(args_of(by, "archipelago-broker").index("--standby=$(BROKER_INDEX)"),
                                                                      "--standby"), "pod 0 would run with --standby"),
        (lambda o, by: set_arg(by, "archipelago-broker", "--index", "1"), "archipelago-broker: --index 1 must be the pod's ordinal"),
    ]
    for fn, reason in faults:
        broken(fn, reason)
    return len(planted) + len(faults)


# ---- 6. the pods on loopback ---------------------------------------------------------


def write_volume(root, files, mode):
    """A ConfigMap or Secret volume as the kubelet writes it: ..data/ and one symlink per file."""
    data = os.path.join(root, "..data")
    os.makedirs(data)
    for name, content in files.items():
        p = os.path.join(data, name)
        with open(p, "wb") as f:
            f.write(content)
        os.chmod(p, mode)
        os.symlink(os.path.join("..data", name), os.path.join(root, name))


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy


def http_get(url, timeout=2):
    with _DIRECT.open(url, timeout=timeout) as r:
        return r.status, r.read().decode()


class Pods:
    def __init__(self, binary, mesh, tmp):
        self.binary, self.mesh, self.tmp = binary, mesh, tmp
        self.net = 100 + os.getpid() % 100  # 127.NET.0.N: one address per pod
        self.ips, self.procs, self.logs, self.roots = {}, {}, {}, {}
        self.killed = set()  # pods whose node the test took away (SIGKILL): their exit is expected
        n = 1
        for comp in ("broker", "shard", "learner"):
            sts = mesh.sts[comp]
            count = mesh.cfg["mesh"]["learners"] if comp == "learner" else sts["spec"].get("replicas", 1)
            for i in range(count):
                self.ips[f"{sts['metadata']['name']}-{i}"] = f"127.{self.net}.0.{n}"
                n += 1

    def command(self, comp, ordinal):
        sts = self.mesh.sts[comp]
        pod = f"{sts['metadata']['name']}-{ordinal}"
        ip = self.ips[pod]
        spec = sts["spec"]["template"]["spec"]
        c = spec["containers"][0]
        root = os.path.join(self.tmp, "pods", pod)
        os.makedirs(root)
        mounts = sorted(c.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
        for m in c.get("volumeMounts", []):
            target = root + m["mountPath"]
            vol = next((v for v in spec.get("volumes", []) if v["name"] == m["name"]), {})
            files = volume_files(self.mesh.by, vol)
            if files is not None:  # a ConfigMap or a Secret: its keys, or only its items at their paths
                write_volume(target, files, vol.get("configMap", vol.get("secret", {})).get("defaultMode", 0o644))
            else:  # emptyDir or a volumeClaimTemplate (its own per pod): an empty directory
                os.makedirs(target)

        def host_path(p):
            for m in mounts:
                mp = m["mountPath"].rstrip("/")
                if p == mp or p.startswith(mp + "/"):
                    return root + p
            raise Failed(f"{pod}: {p} is on no volume (the image's root file system is read-only)")

        def endpoint(ep):
            m = re.fullmatch(r"tcp://([^:]+):(\d+)", ep)
            if not m:
                raise Failed(f"{pod}: {ep} is not tcp://HOST:PORT")
            host = m.group(1)
            if host == "0.0.0.0" or host == ip:  # its own network namespace: here, its own address
                return f"tcp://{ip}:{m.group(2)}"
            pod_dns = host.split(".")
            target = pod_dns[0] if len(pod_dns) >= 2 else None
            if target not in self.ips:
                raise Failed(f"{pod}: dials {host}, which is no pod of the render")
            return f"tcp://{self.ips[target]}:{m.group(2)}"

        env = pod_env(c, ordinal, ip, pod, sts["metadata"].get("namespace", "default"))
        args, out = [expand(a, env) for a in c.get("args", [])], []
        for i, a in enumerate(args):
            prev = args[i - 1] if i else ""
            if prev in ("--broker", "--shards", "--listen"):
                a = ",".join(endpoint(e) for e in a.split(","))
            elif prev == "--set" and "=/" in a:
                k, v = a.split("=", 1)
                a = f"{k}={host_path(v)}"
            elif a.startswith("/"):
                a = host_path(a)
            out.append(a)
        # Path knobs of the ConfigMap's TOML point into the pod's volumes too.
        for section, table in self.mesh.cfg.items():
            for key, value in table.items():
                if isinstance(value, str) and value.startswith("/"):
                    out += ["--set", f"{section}.{key}={host_path(value)}"]
        out += ["--metrics-host", ip, "--json"]  # every pod's metrics port on its own address
        self.roots[pod] = (root, [root + m["mountPath"] for m in mounts])
        return pod, [self.binary] + out

    def start(self, comp, ordinal):
        pod, cmd = self.command(comp, ordinal)
        log = open(os.path.join(self.tmp, f"{pod}.log"), "w")
        self.logs[pod] = log.name
        # The pod's root directory as its working directory: what it writes there
        # (not in a volume) would fail on the read-only root file system.
        self.procs[pod] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           cwd=self.roots[pod][0])
        return pod

    def kill(self, pod):
        """The pod's node is lost: its process dies at once, with no chance to say goodbye."""
        self.killed.add(pod)
        self.procs[pod].send_signal(signal.SIGKILL)
        self.procs[pod].wait()

    def writes_outside_volumes(self):
        stray = []
        for pod, (root, volumes) in self.roots.items():
            for d, dirs, files in os.walk(root):
                if any(d == v or d.startswith(v + "/") for v in volumes):
                    dirs[:] = []
                    continue
                stray += [os.path.join(d, f)[len(root):] for f in files]
        return stray

    def stop(self, pod, timeout=30):
        p = self.procs[pod]
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failed(f"{pod} did not stop within {timeout} s of SIGTERM\n{self.tail(pod)}")

    def tail(self, pod):
        try:
            return f"--- {pod} ---\n" + "".join(open(self.logs[pod]).readlines()[-15:])
        except OSError:
            return ""

    def summary(self, pod):
        lines = [line for line in open(self.logs[pod]).read().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None

    def cleanup(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    def metrics_address(self, comp, ordinal):
        sts = self.mesh.sts[comp]
        pod = f"{sts['metadata']['name']}-{ordinal}"
        port = next(cp["containerPort"] for cp in self.mesh.container(comp)["ports"] if cp["name"] == "metrics")
        return f"{self.ips[pod]}:{port}"

    def metrics_url(self, comp, ordinal, path):
        return f"http://{self.metrics_address(comp, ordinal)}{path}"


def wait(what, predicate, pods, until):
    while time.monotonic() < until:
        got = predicate()
        if got:
            return got
        dead = [pod for pod, p in pods.procs.items() if p.poll() not in (None, 0) and pod not in pods.killed]
        if dead:
            raise Failed(f"while waiting for {what}: {', '.join(dead)} exited\n" + "\n".join(pods.tail(d) for d in dead))
        time.sleep(0.25)
    raise Failed(f"timed out waiting for {what}\n" + "\n".join(pods.tail(p) for p in pods.procs))


def mesh_status(pods, brokers_n):
    """`archipelago status --broker B0,B1 --json` over every broker pod's metrics port: the leader's
    /status with a row per broker (who leads, each one's epoch); None while no broker leads."""
    where = ",".join(pods.metrics_address("broker", i) for i in range(brokers_n))
    try:
        r = run([pods.binary, "status", "--broker", where, "--json", "--timeout", "3"], timeout=30)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def learner_steps(pods, i):
    """A learner's own count of finished steps (its /metrics), or None."""
    try:
        status, body = http_get(pods.metrics_url("learner", i, "/metrics"))
    except OSError:
        return None
    m = re.search(r"^archipelago_learner_steps_total(?:\{[^}]*\})?\s+(\S+)$", body, re.M)
    return int(float(m.group(1))) if status == 200 and m else None


def run_pods(binary, mesh, tmp):
    pods = Pods(binary, mesh, tmp)
    until = time.monotonic() + DEADLINE_S
    shards_n = mesh.sts["shard"]["spec"].get("replicas", 1)
    brokers_n = mesh.sts["broker"]["spec"].get("replicas", 1)
    learners = [f"archipelago-learner-{i}" for i in range(3)]
    try:
        for i in range(brokers_n):  # the primary and its standby, as the StatefulSet starts them (Parallel)
            pods.start("broker", i)
        for i in range(shards_n):
            pods.start("shard", i)
        for i in range(2):  # the learner StatefulSet at 2 replicas
            pods.start("learner", i)

        def all_metrics():
            for comp, n in (("broker", brokers_n), ("shard", shards_n), ("learner", 2)):
                for i in range(n):
                    try:
                        status, body = http_get(pods.metrics_url(comp, i, "/metrics"))
                    except OSError:
                        return False
                    if status != 200 or "# TYPE archipelago_" not in body:
                        return False
            return True

        wait("every pod's /metrics at its prometheus.io port", all_metrics, pods, until)

        def row(doc, learner):
            rows = [r for r in (doc or {}).get("learners", []) if r.get("learner") == learner]
            return rows[-1] if rows else {}

        def led_by(broker):
            doc = mesh_status(pods, brokers_n)
            return doc if doc and doc.get("broker") == broker and doc.get("leading") else None

        def merged(learner, broker=0):
            return row(led_by(broker), learner).get("merged_tokens", 0) > 0

        wait("learners 0 and 1 merged over CURVE", lambda: merged(0) and merged(1), pods, until)
        pods.start("learner", 2)  # kubectl scale --replicas=3
        wait("learner 2 (scaled up) merged", lambda: merged(2), pods, until)
        rc = pods.stop(learners[2])  # kubectl scale --replicas=2: SIGTERM to the highest ordinal
        left = pods.summary(learners[2])
        if rc != 0 or not left or left.get("steps", 0) <= 0:
            raise Failed(f"learner 2 should leave on SIGTERM after some steps, exit 0: exit {rc}, {left}\n{pods.tail(learners[2])}")
        wait("the primary seeing learner 2 leave", lambda: row(led_by(0), 2).get("state") == "left", pods, until)

        # The standby follows the primary: both answer, the primary leads, the standby does not.
        before = wait("broker 0 leading and broker 1 following it (archipelago status)",
                      lambda: (lambda d: d if d and len(d.get("brokers", [])) == brokers_n and all(
                          "error" not in b and b.get("leading") == (b.get("broker") == 0) for b in d["brokers"]) else None)(led_by(0)),
                      pods, until)
        primary_epoch = before["epoch"]

        # The primary's node is lost: its process SIGKILLed, mid-training.
        steps_at_kill = {i: learner_steps(pods, i) or 0 for i in range(2)}
        killed_at = time.monotonic()
        pods.kill("archipelago-broker-0")
        took_over = wait("broker 1 (the standby) leading in a newer epoch than the primary's",
                         lambda: (lambda d: d if d and d.get("epoch", 0) > primary_epoch else None)(led_by(1)), pods, until)
        takeover_s = time.monotonic() - killed_at
        rows = took_over.get("brokers", [])  # in --broker order: the primary's row first
        if len(rows) != brokers_n or "error" not in rows[0] or rows[1].get("broker") != 1 or rows[1].get("leading") is not True:
            raise Failed(f"after the primary's loss, archipelago status should show broker 1 leading and broker 0 "
                         f"unreachable: {took_over.get('brokers')}")
        merged_at = {i: row(took_over, i).get("merged_tokens", 0) for i in range(2)}
        rounds_at = took_over.get("rounds_closed", 0)
        steps_at = {i: learner_steps(pods, i) or 0 for i in range(2)}

        def training_on():
            doc = led_by(1)
            if not doc or doc.get("epoch") != took_over["epoch"] or doc.get("rounds_closed", 0) <= rounds_at:
                return None
            for i in range(2):
                steps = learner_steps(pods, i)
                if steps is None or steps < steps_at[i] + PROGRESS_STEPS or row(doc, i).get("merged_tokens", 0) <= merged_at[i]:
                    return None
            return doc

        after = wait(f"learners 0 and 1 finishing {PROGRESS_STEPS} more steps each and merging under the standby",
                     training_on, pods, until)
        progress = {i: (learner_steps(pods, i) or 0) - steps_at_kill[i] for i in range(2)}

        # kubectl scale --replicas=0: SIGTERM, each learner finishes its step and leaves.
        reports = {2: left}
        for i in range(2):
            rc = pods.stop(learners[i], timeout=60)
            reports[i] = pods.summary(learners[i])
            if rc != 0 or not reports[i] or reports[i].get("steps", 0) < steps_at[i] + PROGRESS_STEPS:
                raise Failed(f"learner {i} should leave on SIGTERM, exit 0, after more than {steps_at[i] + PROGRESS_STEPS} "
                             f"steps: exit {rc}, {reports[i]}\n{pods.tail(learners[i])}")
        for i in range(shards_n):
            if pods.stop(f"archipelago-shard-{i}", timeout=90) != 0:
                raise Failed(f"shard {i} exited non-zero\n{pods.tail(f'archipelago-shard-{i}')}")
        if pods.stop("archipelago-broker-1") != 0:
            raise Failed(f"the standby broker exited non-zero\n{pods.tail('archipelago-broker-1')}")
        stray = pods.writes_outside_volumes()
        if stray:
            raise Failed(f"pods wrote outside their volumes (their root file system is read-only): {stray}")
        b = pods.summary("archipelago-broker-1")
        if not b or not b.get("leading") or not b.get("ledger_balanced") or b.get("rounds", 0) <= 0:
            raise Failed(f"the standby's summary (it should lead at its end, ledger balanced, rounds closed): {b}")
        # Its ledger continued the primary's: every learner's one incarnation, exactly the tokens it reports.
        seen = {}
        for r in b.get("learners", []):
            seen.setdefault(r["learner"], []).append(r)
        if set(seen) != {0, 1, 2}:
            raise Failed(f"the standby's ledger holds learners {sorted(seen)}, not 0, 1, 2: {b}")
        for i, rep in reports.items():
            recs = seen[i]
            if [r["incarnation"] for r in recs] != [rep["incarnation"]] or recs[0].get("processed") != rep.get("tokens"):
                raise Failed(f"learner {i} (incarnation {rep['incarnation']}, {rep.get('tokens')} tokens): the standby's "
                             f"ledger holds {[(r['incarnation'], r.get('processed')) for r in recs]}")
        if b["ledger"]["processed"] != sum(r["tokens"] for r in reports.values()) or b["ledger"]["merged"] <= 0:
            raise Failed(f"the standby's ledger {b['ledger']} vs the learners' {[r['tokens'] for r in reports.values()]}")
        return {"rounds": b["rounds"], "ledger": b["ledger"], "primary_epoch": primary_epoch, "epoch": took_over["epoch"],
                "takeover_s": takeover_s, "progress": progress, "after_rounds": after.get("rounds_closed", 0) - rounds_at}
    finally:
        pods.cleanup()


# ---- main -----------------------------------------------------------------------------


def main():
    binary = os.environ.get("ARCHIPELAGO")
    cache = os.environ.get("K8S_VALIDATE_CACHE")
    if not binary or not cache:
        sys.exit("k8s_manifests_test: set ARCHIPELAGO (the binary) and K8S_VALIDATE_CACHE (npm's install directory)")
    started = time.monotonic()
    passed = 0
    tmp = tempfile.mkdtemp(prefix="archipelago-k8s-")
    try:
        need_tool("kubectl", "it renders deploy/k8s (`kubectl kustomize`); install the kubectl package")
        need_tool("node", "it runs the schema validator; install Node.js (>= 18)")
        need_tool("npm", "it installs the validator's packages; install npm")
        vdir = validator(cache)
        t = time.monotonic()
        rendered = render(binary, tmp, "good")
        objects_json = os.path.join(tmp, "objects.json")
        errors = validate_schema(vdir, [rendered], objects_json)[rendered]
        if errors:
            raise Failed("deploy/k8s does not validate:\n  " + "\n  ".join(errors))
        objects = json.load(open(objects_json))
        print(f"ok: {len(objects)} objects rendered and valid against the Kubernetes API schemas ({time.monotonic() - t:.1f} s)")
        passed += 1
        problems = cross_check(objects)
        if problems:
            raise Failed("deploy/k8s is inconsistent:\n  " + "\n  ".join(problems))
        mesh = Mesh(objects)
        check_config(binary, mesh, tmp)
        print("ok: cross-object checks (selectors, ports, volumes, keys, DNS names, indexes, metrics, replicas, "
              "standby broker and its anti-affinity, config)")
        passed += 1
        packages, needed = check_containerfile(binary, mesh)
        print(f"ok: Containerfile (debian:12 stages; {len(packages)} runtime packages exist and cover {len(needed)} linked libraries)")
        passed += 1
        n = negative_checks(binary, vdir, tmp, rendered, objects)
        print(f"ok: {n} deliberately broken copies refused, each for its planted reason")
        passed += 1
        t = time.monotonic()
        mesh_run = run_pods(binary, mesh, tmp)
        print(f"ok: the pods' command lines on loopback formed a CURVE mesh with a standby broker, scaled 2 -> 3 -> 2 "
              f"learners; primary SIGKILLed -> standby leading (epoch {mesh_run['primary_epoch']} -> {mesh_run['epoch']}) "
              f"{mesh_run['takeover_s']:.1f} s later (as archipelago status saw it), the learners went on "
              f"({mesh_run['progress']} steps since the kill, {mesh_run['after_rounds']} rounds closed by the standby "
              f"while waited for); standby's ledger {mesh_run['ledger']} balanced and equal to the learners' own counts, "
              f"{mesh_run['rounds']} rounds ({time.monotonic() - t:.1f} s)")
        passed += 1
    except Failed as e:
        print(f"FAIL: {e}", file=sys.stderr)
        print(f"k8s manifests: {passed} passed, 1 failed ({time.monotonic() - started:.1f} s)")
        sys.exit(1)
    finally:
        if os.environ.get("K8S_KEEP") == "1":
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"k8s manifests: {passed} passed, 0 failed ({time.monotonic() - started:.1f} s)")


if __name__ == "__main__":
    main()
