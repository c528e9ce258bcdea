"""Offline validation of the Kubernetes manifests `replibench export` writes.

A manifest that the API server or the training operator would refuse should fail
here, before anyone applies it, and in the tests without a cluster:

  * TFJob (kubeflow.org/v1): the vendored CRD's openAPIV3Schema
    (third_party/kubeflow_training_operator/, release v1.9.0), made strict as
    `kubectl apply --validate=strict` is: an object schema that lists its
    properties and neither preserves unknown fields nor says what other keys
    hold rejects any other key. Then the rules of the operator's admission
    webhook (pkg/webhooks/tensorflow/tfjob_webhook.go) that a schema cannot
    say, and TensorFlow's own: known replica types, one Chief or Master with one
    replica, a container named `tensorflow` with an image in every template.
  * Service and Job (core Kubernetes): kubernetes-validate's strict offline
    schemas for K8S_VERSION, plus the API server's cross-field rules that the
    export relies on, and the manifest's own consistency (the Job's subdomain is
    a headless Service that selects its pods; REPLIBENCH_K8S_TASKS lists one task
    per index).

CEL rules in the CRD (x-kubernetes-validations: one, on an update) are not run.
"""

import copy
import functools
import json
import os
import re

import yaml

from replibench import errors
from replibench.cluster import K8S_TASKS_ENV as TASKS_ENV

CONTAINER = "tensorflow"   # The TFJob operator puts TF_CONFIG into this container only.
K8S_VERSION = "1.31.0"   # The oldest Kubernetes with the Job successPolicy (beta, on).
TFJOB_API = "kubeflow.org/v1"
CRD_PATH = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "third_party",
                        "kubeflow_training_operator", "kubeflow.org_tfjobs.yaml")
REPLICA_TYPES = ("Chief", "Master", "Worker", "PS", "Evaluator")
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_LABEL = 63

# ObjectMeta as a generated manifest may write it (the CRD leaves metadata open; the
# API server checks it against ObjectMeta, of which export writes these fields).
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {"type": "object", "additionalProperties": False,
             "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                            "labels": _STRING_MAP, "annotations": _STRING_MAP}}


class InvalidManifest(Exception):
  """A manifest the API server or the operator would refuse; the message lists why."""


def check(doc: dict) -> None:
  """Raises InvalidManifest, listing every problem found, unless doc is valid."""
  found = problems(doc)
  if found:
    what = f"{doc.get('kind', '?')} {doc.get('metadata', {}).get('name', '?')}"
    raise InvalidManifest(f"{what}: " + "; ".join(found))


def check_all(docs: list[dict]) -> None:
  """check() for each document, and the Job's references to the other documents."""
  for doc in docs:
    check(doc)
  found = [p for doc in docs if doc.get("kind") == "Job" for p in _job_references(doc, docs)]
  if found:
    raise InvalidManifest("; ".join(found))


def problems(doc: dict) -> list[str]:
  """What is wrong with one document, as 'path: message' lines (empty: valid)."""
  if not isinstance(doc, dict):
    return [f"a manifest is a mapping, not {type(doc).__name__}"]
  kind = doc.get("kind")
  if kind == "TFJob":
    return tfjob_problems(doc)
  if kind in ("Service", "Job"):
    return core_problems(doc)
  return [f"kind {kind!r}: export writes TFJob, Service and Job only"]


# --- TFJob -------------------------------------------------------------------------------


def tfjob_problems(doc: dict) -> list[str]:
  found = _schema_problems(_tfjob_validator(), doc)
  if doc.get("apiVersion") != TFJOB_API:
    found.append(f"apiVersion: {doc.get('apiVersion')!r}, not {TFJOB_API!r}")
  found += _metadata_problems(doc.get("metadata"), "metadata", DNS1035)
  specs = (doc.get("spec") or {}).get("tfReplicaSpecs")
  if isinstance(specs, dict):
    found += _replica_problems(specs)
  return found


def _replica_problems(specs: dict) -> list[str]:
  """The webhook's rules, and TensorFlow's: replica types, one chief, the container."""
  found, chiefs = [], 0
  for rtype, rspec in specs.items():
    path = f"spec.tfReplicaSpecs.{rtype}"
    if rtype not in REPLICA_TYPES:
      found.append(f"{path}: unknown replica type (the operator knows "
                   f"{', '.join(REPLICA_TYPES)})")
    if not isinstance(rspec, dict):
      continue   # The schema has said what is wrong.
    if rtype in ("Chief", "Master"):
      replicas = rspec.get("replicas", 1)
      chiefs += replicas if isinstance(replicas, int) else 1
    pod = ((rspec.get("template") or {}).get("spec") or {})
    containers = pod.get("containers") or []
    if not any(isinstance(c, dict) and c.get("name") == CONTAINER for c in containers):
      found.append(f"{path}.template.spec.containers: no container named {CONTAINER!r} "
                   f"(the operator sets TF_CONFIG in that one only)")
    found += [f"{path}.template.spec.containers[{i}].image: required"
              for i, c in enumerate(containers) if isinstance(c, dict) and not c.get("image")]
  if chiefs > 1:
    found.append(f"spec.tfReplicaSpecs: {chiefs} Chief/Master replicas; a TensorFlow "
                 f"cluster has at most one")
  return found


@functools.lru_cache(maxsize=1)
def _tfjob_validator():
  import jsonschema  # pylint: disable=import-outside-toplevel
  path = os.path.normpath(CRD_PATH)
  if not os.path.exists(path):
    raise errors.UserError(f"the TFJob CRD {path} is missing; export validates TFJobs "
                           f"against it (run from a replibench checkout).")
  with open(path, encoding="utf-8") as f:
    crd = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
  version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
  schema = strict(version["schema"]["openAPIV3Schema"])
  # The CRD leaves the TFJob's ObjectMeta open (the API server checks it against its
  # own schema): the fields a generated manifest writes. Pod templates' it spells out.
  schema["properties"]["metadata"] = _METADATA
  return jsonschema.Draft7Validator(schema)


def strict(schema: dict) -> dict:
  """A copy of an OpenAPI v3 structural schema that rejects unknown fields.

  As the API server prunes (and --validate=strict refuses) them: a schema with
  `properties` and without x-kubernetes-preserve-unknown-fields or its own
  additionalProperties admits only those keys.
  """
  schema = copy.deepcopy(schema)
  _make_strict(schema)
  return schema


def _make_strict(node: dict) -> None:
  if "properties" in node and "additionalProperties" not in node and not node.get(
      "x-kubernetes-preserve-unknown-fields"):
    node["additionalProperties"] = False
  # Walk the schema's structure only: a property may be named 'type' or 'items'.
  children = list((node.get("properties") or {}).values())
  for key in ("items", "additionalProperties", "not"):
    if isinstance(node.get(key), dict):
      children.append(node[key])
  for key in ("anyOf", "allOf", "oneOf"):
    children += node.get(key) or []
  for child in children:
    _make_strict(child)


# --- Service and Job ---------------------------------------------------------------------


def core_problems(doc: dict) -> list[str]:
  found = _kubernetes_validate(doc)
  metadata = doc.get("metadata")
  name_rule = DNS1035 if doc.get("kind") == "Service" else DNS1123
  found += _metadata_problems(metadata, "metadata", name_rule)
  if doc.get("kind") == "Job" and isinstance(doc.get("spec"), dict):
    found += _job_problems(doc["spec"])
  return found


def _kubernetes_validate(doc: dict) -> list[str]:
  import kubernetes_validate  # pylint: disable=import-outside-toplevel
  try:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
  except kubernetes_validate.ValidationError as e:
    return [f"{_path(e.absolute_path)}: {e.message}"]
  except kubernetes_validate.SchemaNotFoundError as e:
    return [e.message]
  return []


def _job_problems(spec: dict) -> list[str]:
  """The API server's rules for the Job fields export sets (pkg/apis/batch/validation)."""
  found = []
  pod = ((spec.get("template") or {}).get("spec") or {})
  indexed = spec.get("completionMode") == "Indexed"
  if indexed and not isinstance(spec.get("completions"), int):
    found.append("spec.completions: required with completionMode Indexed")
  for field in ("successPolicy", "backoffLimitPerIndex"):
    if field in spec and not indexed:
      found.append(f"spec.{field}: only with completionMode Indexed")
  if "podFailurePolicy" in spec and pod.get("restartPolicy") != "Never":
    found.append(f"spec.template.spec.restartPolicy: {pod.get('restartPolicy')!r}; "
                 f"a podFailurePolicy needs 'Never'")
  names = {c.get("name") for c in pod.get("containers") or [] if isinstance(c, dict)}
  if CONTAINER not in names:
    found.append(f"spec.template.spec.containers: no container named {CONTAINER!r}")
  for i, rule in enumerate((spec.get("podFailurePolicy") or {}).get("rules") or []):
    container = ((rule or {}).get("onExitCodes") or {}).get("containerName")
    if container is not None and container not in names:
      found.append(f"spec.podFailurePolicy.rules[{i}].onExitCodes.containerName: "
                   f"{container!r} is not a container of the template")
  return found


def _job_references(job: dict, docs: list[dict]) -> list[str]:
  """The Job's pods resolve through a headless Service of the manifest, and its task
  list has one entry per index."""
  spec, name = job.get("spec") or {}, job["metadata"]["name"]
  pod_meta = (spec.get("template") or {}).get("metadata") or {}
  pod = (spec.get("template") or {}).get("spec") or {}
  found = []
  services = [d for d in docs if d.get("kind") == "Service"
              and d["metadata"]["name"] == pod.get("subdomain")]
  if not services:
    found.append(f"Job {name}: spec.template.spec.subdomain {pod.get('subdomain')!r} names "
                 f"no Service of the manifest (its pods would not resolve)")
  for service in services:
    sspec = service.get("spec") or {}
    if sspec.get("clusterIP") != "None":
      found.append(f"Service {service['metadata']['name']}: spec.clusterIP "
                   f"{sspec.get('clusterIP')!r}; pod DNS names need a headless Service (None)")
    labels = pod_meta.get("labels") or {}
    if not sspec.get("selector") or any(labels.get(k) != v
                                        for k, v in sspec["selector"].items()):
      found.append(f"Service {service['metadata']['name']}: spec.selector does not select "
                   f"the Job's pods (labels {labels})")
  tasks = _tasks_env(pod)
  count = sum(len(v) for v in tasks.values()) if isinstance(tasks, dict) else None
  if count is None:
    found.append(f"Job {name}: the {CONTAINER} container's {TASKS_ENV} is not a JSON object "
                 f"of task lists")
  elif not count == spec.get("completions") == spec.get("parallelism"):
    found.append(f"Job {name}: {TASKS_ENV} lists {count} task(s), completions "
                 f"{spec.get('completions')}, parallelism {spec.get('parallelism')}: one "
                 f"task per index, all running at once")
  return found


def _tasks_env(pod: dict):
  for container in pod.get("containers") or []:
    if container.get("name") != CONTAINER:
      continue
    for var in container.get("env") or []:
      if var.get("name") == TASKS_ENV:
        try:
          return json.loads(var.get("value", ""))
        except ValueError:
          return None
  return None


# --- shared ------------------------------------------------------------------------------


def _metadata_problems(metadata, path: str, name_rule) -> list[str]:
  """Names the API server accepts (and a pod's hostname fits in 63 characters)."""
  if not isinstance(metadata, dict):
    return [] if name_rule is None else [f"{path}: required"]
  found = []
  name = metadata.get("name")
  if name_rule is not None and not (isinstance(name, str) and len(name) <= MAX_LABEL
                                    and name_rule.match(name)):
    found.append(f"{path}.name: {name!r} is not a DNS label of at most {MAX_LABEL} "
                 f"lower-case letters, digits and '-'"
                 + (" starting with a letter" if name_rule is DNS1035 else ""))
  namespace = metadata.get("namespace")
  if namespace is not None and not (isinstance(namespace, str) and DNS1123.match(namespace)
                                    and len(namespace) <= MAX_LABEL):
    found.append(f"{path}.namespace: {namespace!r} is not a DNS-1123 label")
  return found


def _schema_problems(validator, doc: dict) -> list[str]:
  return [f"{_path(e.absolute_path)}: {e.message}"
          for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.path)))]


def _path(parts) -> str:
  text = ""
  for part in parts:
    text += f"[{part}]" if isinstance(part, int) else f".{part}"
  return text.lstrip(".") or "(top)"
