// Validates rendered Kubernetes manifests offline, without an API server:
//
//   node validate.mjs RENDERED.yaml... [--dump OBJECTS.json]
//
// Every object is checked against its kind's OpenAPI schema (kubernetes-models),
// strictly: a field the schema does not declare is an error (the schemas
// themselves allow unknown fields, which an API server would prune or reject).
// On top, the rules the API server enforces that no schema expresses: name and
// label syntax, port and env names, selectors that match their template, volume
// mounts that name a volume, $(VAR) references to defined variables, limits >=
// requests, field paths the downward API knows. Prints one line per error
// ("error: FILE: OBJECT: what") and a JSON line last, with the errors per file;
// exit 0 only without errors. --dump writes the first file's objects as JSON.

import { readFileSync, writeFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const errors = [];
const fail = (where, message) => errors.push(`${where}: ${message}`);

// ---- strict schema validation ----------------------------------------------

// The compiled schema validators read exactly the properties their schema
// declares. Validating a proxy of the object records what was read: an own key
// of an object whose properties were read but that was never itself read is a
// field the schema does not know. Objects the validator enumerates (maps such
// as labels or ConfigMap data) or never looks into (free-form) are not judged.
function tracked(value, path, records) {
  if (value === null || typeof value !== "object") return value;
  const rec = { path, value, read: new Set(), enumerated: false, children: new Map() };
  records.push(rec);
  return new Proxy(value, {
    get(target, key) {
      const v = Reflect.get(target, key);
      if (typeof key !== "string") return v;
      rec.read.add(key);
      if (v === null || typeof v !== "object" || !Object.prototype.hasOwnProperty.call(target, key)) return v;
      if (!rec.children.has(key)) rec.children.set(key, tracked(v, `${path}/${key}`, records));
      return rec.children.get(key);
    },
    has(target, key) {
      if (typeof key === "string") rec.read.add(key);
      return Reflect.has(target, key);
    },
    ownKeys(target) {
      rec.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

async function modelFor(apiVersion, kind) {
  // "v1" -> kubernetes-models/v1, "apps/v1" -> kubernetes-models/apps/v1
  let mod;
  try {
    mod = await import(`kubernetes-models/${apiVersion}`);
  } catch {
    return null;
  }
  return typeof mod[kind] === "function" ? mod[kind] : null;
}

async function validateSchema(obj, where) {
  const Model = await modelFor(obj.apiVersion, obj.kind);
  if (!Model) return fail(where, `no schema for apiVersion ${obj.apiVersion} kind ${obj.kind}`);
  const copy = structuredClone(obj);
  // Base64 fields (Secret data, ConfigMap binaryData): kustomize wraps them in
  // lines, and the API server's decoder (Go's encoding/base64) ignores newlines.
  for (const map of [copy.kind === "Secret" ? copy.data : null, copy.kind === "ConfigMap" ? copy.binaryData : null])
    for (const [k, v] of Object.entries(map ?? {})) if (typeof v === "string") map[k] = v.replace(/[\r\n]/g, "");
  const records = [];
  const root = tracked(copy, "", records);
  try {
    // The model's validate() runs the compiled validator on `this`.
    Model.prototype.validate.call(root);
  } catch (e) {
    for (const part of String(e.message).split(", data")) fail(where, `schema: ${part.replace(/^data/, "")}`);
  }
  for (const rec of records) {
    if (Array.isArray(rec.value) || rec.enumerated || rec.read.size === 0) continue;
    for (const key of Object.keys(rec.value))
      if (!rec.read.has(key)) fail(where, `schema: ${rec.path}/${key} is not a field of this object`);
  }
}

// ---- API server rules --------------------------------------------------------

const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1035_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const ENV_NAME = /^[-._a-zA-Z][-._a-zA-Z0-9]*$/;
const FIELD_PATHS = /^(metadata\.(name|namespace|uid)|metadata\.(labels|annotations)\['[^']+'\]|spec\.(nodeName|serviceAccountName)|status\.(hostIP|hostIPs|podIP|podIPs))$/;

const isLabel = (s) => typeof s === "string" && s.length <= 63 && DNS1123_LABEL.test(s);
const isSubdomain = (s) =>
  typeof s === "string" && s.length <= 253 && s.split(".").every((p) => p.length <= 63 && DNS1123_LABEL.test(p));
// IANA service name: at most 15 characters, lowercase letters, digits and single
// inner hyphens, at least one letter.
const isPortName = (s) =>
  typeof s === "string" && s.length <= 15 && /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/.test(s) && !s.includes("--") && /[a-z]/.test(s);

function checkLabels(labels, where) {
  for (const [key, value] of Object.entries(labels ?? {})) {
    const slash = key.lastIndexOf("/");
    const prefix = slash >= 0 ? key.slice(0, slash) : null;
    const name = slash >= 0 ? key.slice(slash + 1) : key;
    if (prefix !== null && !isSubdomain(prefix)) fail(where, `label key '${key}': bad prefix`);
    if (name.length > 63 || !LABEL_NAME.test(name)) fail(where, `label key '${key}' is not a valid label name`);
    if (typeof value !== "string" || value.length > 63 || (value !== "" && !LABEL_NAME.test(value)))
      fail(where, `label '${key}': value '${value}' is not a valid label value`);
  }
}

// Quantities ("500m", "1Gi", "2") as numbers, for comparing limits with requests.
function quantity(q) {
  const m = /^([+-]?[0-9.]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$/.exec(String(q));
  if (!m) return NaN;
  const scale = { m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60 };
  return Number(m[1]) * (m[2] ? scale[m[2]] : 1);
}

function checkContainer(c, volumeNames, where) {
  const at = `${where} container ${c.name}`;
  if (!isLabel(c.name)) fail(at, "container name is not a DNS-1123 label");
  const portNames = new Set();
  for (const p of c.ports ?? []) {
    if (p.name === undefined) continue;
    if (!isPortName(p.name)) fail(at, `port name '${p.name}' is not an IANA service name (<= 15 chars, [a-z0-9-])`);
    if (portNames.has(p.name)) fail(at, `port name '${p.name}' used twice`);
    portNames.add(p.name);
  }
  const defined = new Set();
  // $(VAR) in env values may name variables defined before it; in command and
  // args any of the container's. The kubelet leaves an unknown reference as is.
  const checkRefs = (text, known, what) => {
    for (const [, name] of String(text).matchAll(/(?<!\$)\$\(([^)]*)\)/g))
      if (!known.has(name)) fail(at, `${what} refers to $(${name}), which is not defined in env`);
  };
  for (const e of c.env ?? []) {
    if (!ENV_NAME.test(e.name)) fail(at, `env name '${e.name}' is not valid`);
    if (e.value !== undefined) checkRefs(e.value, defined, `env ${e.name}`);
    const path = e.valueFrom?.fieldRef?.fieldPath;
    if (path !== undefined && !FIELD_PATHS.test(path)) fail(at, `env ${e.name}: fieldPath '${path}' is not one the downward API offers`);
    defined.add(e.name);
  }
  for (const arg of [...(c.command ?? []), ...(c.args ?? [])]) checkRefs(arg, defined, `argument '${arg}'`);
  const mountPaths = new Set();
  for (const m of c.volumeMounts ?? []) {
    if (!volumeNames.has(m.name)) fail(at, `volumeMount '${m.name}' names no volume of the pod`);
    if (!m.mountPath?.startsWith("/")) fail(at, `mountPath '${m.mountPath}' is not absolute`);
    if (mountPaths.has(m.mountPath)) fail(at, `mountPath '${m.mountPath}' mounted twice`);
    mountPaths.add(m.mountPath);
  }
  for (const probe of ["readinessProbe", "livenessProbe", "startupProbe"]) {
    const port = c[probe]?.httpGet?.port ?? c[probe]?.tcpSocket?.port;
    if (typeof port === "string" && !portNames.has(port)) fail(at, `${probe} uses port '${port}', which the container does not name`);
  }
  const { requests = {}, limits = {} } = c.resources ?? {};
  for (const [res, limit] of Object.entries(limits)) {
    for (const [what, q] of [["limit", limit], ["request", requests[res]]])
      if (q !== undefined && Number.isNaN(quantity(q))) fail(at, `${res} ${what} '${q}' is not a quantity`);
    if (requests[res] !== undefined && quantity(requests[res]) > quantity(limit))
      fail(at, `${res} request ${requests[res]} exceeds its limit ${limit}`);
  }
}

function checkPodSpec(spec, claimNames, where) {
  const volumeNames = new Set(claimNames);
  for (const v of spec.volumes ?? []) {
    if (!isLabel(v.name)) fail(where, `volume name '${v.name}' is not a DNS-1123 label`);
    if (volumeNames.has(v.name)) fail(where, `volume '${v.name}' declared twice`);
    volumeNames.add(v.name);
    const mode = v.secret?.defaultMode ?? v.configMap?.defaultMode;
    if (mode !== undefined && (mode < 0 || mode > 0o777)) fail(where, `volume '${v.name}': defaultMode ${mode} is not in 0..0777`);
  }
  const names = new Set();
  for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
    if (names.has(c.name)) fail(where, `container name '${c.name}' used twice`);
    names.add(c.name);
    checkContainer(c, volumeNames, where);
  }
}

function checkObject(obj, where) {
  const md = obj.metadata ?? {};
  if (obj.kind === "Namespace" || obj.kind === "Service") {
    const ok = obj.kind === "Service" ? md.name?.length <= 63 && DNS1035_LABEL.test(md.name) : isLabel(md.name);
    if (!ok) fail(where, `name '${md.name}' is not a DNS-${obj.kind === "Service" ? 1035 : 1123} label`);
  } else if (!isSubdomain(md.name)) fail(where, `name '${md.name}' is not a DNS-1123 subdomain`);
  if (md.namespace !== undefined && !isLabel(md.namespace)) fail(where, `namespace '${md.namespace}' is not a DNS-1123 label`);
  checkLabels(md.labels, where);

  if (obj.kind === "Service") {
    const ports = obj.spec?.ports ?? [];
    const names = new Set();
    for (const p of ports) {
      if (ports.length > 1 && !p.name) fail(where, "a Service with several ports must name each");
      if (p.name !== undefined && !isLabel(p.name)) fail(where, `port name '${p.name}' is not a DNS-1123 label`);
      if (names.has(p.name)) fail(where, `port name '${p.name}' used twice`);
      names.add(p.name);
      if (typeof p.targetPort === "string" && !isPortName(p.targetPort)) fail(where, `targetPort '${p.targetPort}' is not an IANA service name`);
    }
    checkLabels(obj.spec?.selector, `${where} selector`);
  }

  const template = obj.spec?.template;
  if (template && ["Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"].includes(obj.kind)) {
    checkLabels(template.metadata?.labels, `${where} template`);
    const selector = obj.spec.selector?.matchLabels ?? {};
    for (const [k, v] of Object.entries(selector))
      if (template.metadata?.labels?.[k] !== v) fail(where, `selector ${k}=${v} does not match the template's labels`);
    if (obj.kind === "StatefulSet") {
      // Pods get the label controller-revision-hash=NAME-HASH, at most 63 characters.
      if (md.name.length > 52) fail(where, "a StatefulSet's name must not exceed 52 characters");
      if (!obj.spec.serviceName) fail(where, "a StatefulSet needs spec.serviceName (its governing headless Service)");
    }
    const claims = (obj.spec.volumeClaimTemplates ?? []).map((c) => c.metadata?.name);
    checkPodSpec(template.spec ?? {}, claims, where);
  }
}

// ---- main ------------------------------------------------------------------

async function validateFile(file) {
  let text;
  try {
    text = readFileSync(file, "utf8");
  } catch (e) {
    console.error(`validate: cannot read ${file}: ${e.message}`);
    process.exit(2);
  }
  const objects = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) {
      for (const e of doc.errors) fail("YAML", e.message);
      continue;
    }
    const obj = doc.toJS();
    if (obj !== null && obj !== undefined) objects.push(obj);
  }
  if (objects.length === 0 && errors.length === 0) fail("file", "no objects");
  for (const [i, obj] of objects.entries()) {
    const where = `${obj?.kind ?? "?"}/${obj?.metadata?.name ?? `#${i}`}`;
    if (typeof obj !== "object" || typeof obj.apiVersion !== "string" || typeof obj.kind !== "string") {
      fail(where, "not a Kubernetes object (apiVersion and kind are required)");
      continue;
    }
    await validateSchema(obj, where);
    checkObject(obj, where);
  }
  const seen = new Set();
  for (const obj of objects) {
    const key = `${obj.kind}/${obj.metadata?.namespace ?? ""}/${obj.metadata?.name}`;
    if (seen.has(key)) fail(key, "defined twice");
    seen.add(key);
  }
  return objects;
}

const args = process.argv.slice(2);
const files = [];
let dump = null;
for (let i = 0; i < args.length; ++i) {
  if (args[i] === "--dump") dump = args[++i] ?? "";
  else files.push(args[i]);
}
if (files.length === 0 || dump === "") {
  console.error("usage: node validate.mjs RENDERED.yaml... [--dump OBJECTS.json]");
  process.exit(2);
}
const report = {};
let total = 0;
for (const [n, file] of files.entries()) {
  errors.length = 0;
  const objects = await validateFile(file);
  if (n === 0 && dump) writeFileSync(dump, JSON.stringify(objects));
  for (const e of errors) console.log(`error: ${file}: ${e}`);
  report[file] = { objects: objects.length, errors: errors.length };
  total += errors.length;
}
console.log(JSON.stringify({ command: "k8s-validate", files: report, errors: total }));
process.exit(total ? 1 : 0);
