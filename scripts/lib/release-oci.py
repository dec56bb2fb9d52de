#!/usr/bin/env python3
"""The OCI registry steps of scripts/release.sh.

    release-oci.py chart CHART_DIR --registry R --out DIR [--plain-http]
        package CHART_DIR as DIR/<name>-<version>.tgz and push it to oci://R/charts
        (Helm v4's library: run it with the python of scripts/helm-env.sh)
    release-oci.py sbom FILE --registry R --repository NAME --tag TAG --subject-tag TAG
                   [--plain-http]
        push FILE (CycloneDX JSON) as an OCI artifact R/NAME:TAG whose subject is the
        manifest R/NAME:SUBJECT-TAG (the image), listed as the image's referrer
    release-oci.py pull-chart oci://R/charts/NAME --version V --out DIR [--plain-http]
        pull a chart with Helm's library and unpack it into DIR/NAME
    release-oci.py artifact FILE... --registry R --repository NAME --tag TAG
                   --artifact-type TYPE [--plain-http]
        push FILEs as the layers of one OCI artifact R/NAME:TAG, each titled with its
        file name (`oras pull R/NAME:TAG` writes them back under those names)
    release-oci.py pull-artifact R/NAME:TAG --out DIR [--plain-http]
        write each titled layer of the artifact into DIR, its digest checked

Each command prints one JSON object on stdout. R is HOST[:PORT][/PATH]. With
REGISTRY_USERNAME and REGISTRY_PASSWORD set, they log in (Basic, or a Bearer token from
the registry's token service); otherwise the registry must allow anonymous pushes.

The SBOM push speaks the registry HTTP API (OCI distribution spec) with the standard
library only: blob uploads (POST, then PUT with the digest), a manifest PUT, and, where
the registry has no referrers API (`GET /v2/NAME/referrers/DIGEST`), the spec's fallback:
an image index tagged `sha256-<hex of the subject>` listing the artifacts that refer to it.
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
CYCLONEDX = "application/vnd.cyclonedx+json"
MANIFEST_ACCEPT = ", ".join([OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST])


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Registry:
    """A registry's HTTP API v2 for one host, with Basic or Bearer auth when asked."""

    def __init__(self, host: str, plain_http: bool):
        self.base = ("http://" if plain_http else "https://") + host
        self.user = os.environ.get("REGISTRY_USERNAME")
        self.password = os.environ.get("REGISTRY_PASSWORD")
        self.auth = None

    def _basic(self):
        if self.user is None or self.password is None:
            return None
        pair = f"{self.user}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()

    def _login(self, challenge: str):
        """Answers a 401's WWW-Authenticate challenge; False when it cannot."""
        scheme, _, params = challenge.partition(" ")
        if scheme.lower() == "basic":
            self.auth = self._basic()
            return self.auth is not None
        if scheme.lower() != "bearer":
            return False
        fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
        realm = fields.pop("realm", None)
        if not realm:
            return False
        url = realm + "?" + urllib.parse.urlencode(fields)
        req = urllib.request.Request(url)
        basic = self._basic()
        if basic:
            req.add_header("Authorization", basic)
        with urllib.request.urlopen(req, timeout=60) as resp:
            body = json.load(resp)
        token = body.get("token") or body.get("access_token")
        if not token:
            return False
        self.auth = "Bearer " + token
        return True

    def request(self, method: str, path: str, data=None, headers=None, ok=(200,)):
        """(status, headers, body) of one request; a status outside `ok` raises, but for
        a 404 of a GET or HEAD (something absent), which is returned."""
        url = path if path.startswith("http") else self.base + path
        for attempt in range(2):
            req = urllib.request.Request(url, data=data, method=method)
            for k, v in (headers or {}).items():
                req.add_header(k, v)
            if self.auth:
                req.add_header("Authorization", self.auth)
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    return resp.status, resp.headers, resp.read()
            except urllib.error.HTTPError as e:
                body = e.read()
                challenge = e.headers.get("WWW-Authenticate", "")
                if e.code == 401 and attempt == 0 and challenge and self._login(challenge):
                    continue
                if e.code in ok or (e.code == 404 and method in ("GET", "HEAD")):
                    return e.code, e.headers, body
                raise SystemExit(
                    f"release-oci: {method} {url}: {e.code} {body.decode(errors='replace')[:400]}"
                ) from None
        raise SystemExit(f"release-oci: {method} {url}: unauthorized")

    def push_blob(self, name: str, data: bytes) -> dict:
        """Uploads `data` unless the registry has it; its descriptor (digest, size)."""
        digest = sha256(data)
        status, _, _ = self.request("HEAD", f"/v2/{name}/blobs/{digest}")
        if status != 200:
            status, headers, _ = self.request("POST", f"/v2/{name}/blobs/uploads/", data=b"", ok=(202,))
            if status != 202:
                raise SystemExit(f"release-oci: starting an upload to {name}: {status}")
            location = urllib.parse.urljoin(self.base + "/", headers["Location"])
            sep = "&" if "?" in location else "?"
            self.request(
                "PUT",
                f"{location}{sep}digest={urllib.parse.quote(digest)}",
                data=data,
                headers={"Content-Type": "application/octet-stream"},
                ok=(201,),
            )
        return {"digest": digest, "size": len(data)}

    def manifest(self, name: str, reference: str):
        """(descriptor, parsed manifest) of NAME:REFERENCE, or (None, None) when absent."""
        status, headers, body = self.request(
            "GET", f"/v2/{name}/manifests/{reference}", headers={"Accept": MANIFEST_ACCEPT}
        )
        if status != 200:
            return None, None
        media_type = headers.get("Content-Type", "").split(";")[0].strip()
        manifest = json.loads(body)
        media_type = manifest.get("mediaType", media_type)
        return {"mediaType": media_type, "digest": sha256(body), "size": len(body)}, manifest

    def put_manifest(self, name: str, reference: str, manifest: dict) -> dict:
        body = json.dumps(manifest, separators=(",", ":")).encode()
        self.request(
            "PUT",
            f"/v2/{name}/manifests/{reference}",
            data=body,
            headers={"Content-Type": manifest["mediaType"]},
            ok=(201,),
        )
        return {"mediaType": manifest["mediaType"], "digest": sha256(body), "size": len(body)}

    def has_referrers_api(self, name: str, digest: str) -> bool:
        status, headers, _ = self.request(
            "GET", f"/v2/{name}/referrers/{digest}", headers={"Accept": OCI_INDEX}
        )
        return status == 200 and headers.get("Content-Type", "").startswith(OCI_INDEX)


def split_registry(registry: str):
    """HOST[:PORT][/PATH] -> (HOST[:PORT], 'PATH/' or '')."""
    host, _, path = registry.strip("/").partition("/")
    return host, (path + "/" if path else "")


def cmd_sbom(a) -> dict:
    host, prefix = split_registry(a.registry)
    name = prefix + a.repository
    reg = Registry(host, a.plain_http)
    subject, _ = reg.manifest(name, a.subject_tag)
    if subject is None:
        raise SystemExit(f"release-oci: {host}/{name}:{a.subject_tag} not found (push the image first)")
    with open(a.file, "rb") as f:
        sbom = f.read()
    json.loads(sbom)  # it is JSON, or nothing is pushed
    empty = b"{}"
    config = dict(reg.push_blob(name, empty), mediaType=EMPTY_CONFIG)
    layer = dict(
        reg.push_blob(name, sbom),
        mediaType=CYCLONEDX,
        annotations={"org.opencontainers.image.title": os.path.basename(a.file)},
    )
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": CYCLONEDX,
        "config": config,
        "layers": [layer],
        "subject": subject,
        "annotations": {"org.opencontainers.image.created": created},
    }
    pushed = reg.put_manifest(name, a.tag, manifest)
    pushed["artifactType"] = CYCLONEDX
    referrers = "api"
    if not reg.has_referrers_api(name, subject["digest"]):
        # The referrers tag schema: an index under sha256-<hex> lists the subject's referrers.
        referrers = "sha256-" + subject["digest"].split(":", 1)[1]
        _, index = reg.manifest(name, referrers)
        if not index or index.get("mediaType") != OCI_INDEX:
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []}
        index["manifests"] = [m for m in index["manifests"] if m.get("digest") != pushed["digest"]]
        index["manifests"].append(dict(pushed, annotations=manifest["annotations"]))
        reg.put_manifest(name, referrers, index)
    return {
        "ref": f"{host}/{name}:{a.tag}",
        "digest": pushed["digest"],
        "subject": subject["digest"],
        "referrers": referrers,
    }


# Media types of an artifact's layers, by file name.
def layer_media_type(path: str) -> str:
    if path.endswith(".tar.gz"):
        return "application/vnd.oci.image.layer.v1.tar+gzip"
    if path.endswith(".cdx.json"):
        return CYCLONEDX
    return "text/plain"


def cmd_artifact(a) -> dict:
    host, prefix = split_registry(a.registry)
    name = prefix + a.repository
    reg = Registry(host, a.plain_http)
    config = dict(reg.push_blob(name, b"{}"), mediaType=EMPTY_CONFIG)
    layers = []
    for path in a.files:
        with open(path, "rb") as f:
            data = f.read()
        layers.append(dict(
            reg.push_blob(name, data),
            mediaType=layer_media_type(path),
            annotations={"org.opencontainers.image.title": os.path.basename(path)},
        ))
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": a.artifact_type,
        "config": config,
        "layers": layers,
        "annotations": {"org.opencontainers.image.created": created},
    }
    pushed = reg.put_manifest(name, a.tag, manifest)
    return {"ref": f"{host}/{name}:{a.tag}", "digest": pushed["digest"],
            "files": [l["annotations"]["org.opencontainers.image.title"] for l in layers]}


def cmd_pull_artifact(a) -> dict:
    ref, _, tag = a.ref.rpartition(":")
    if not ref or "/" in tag:
        raise SystemExit(f"release-oci: {a.ref} is not REGISTRY/NAME:TAG")
    host, _, name = ref.partition("/")
    reg = Registry(host, a.plain_http)
    _, manifest = reg.manifest(name, tag)
    if manifest is None:
        raise SystemExit(f"release-oci: {a.ref} not found")
    os.makedirs(a.out, exist_ok=True)
    written = []
    for layer in manifest.get("layers", []):
        title = layer.get("annotations", {}).get("org.opencontainers.image.title", "")
        if not title or os.path.basename(title) != title or title.startswith("."):
            continue
        status, _, data = reg.request("GET", f"/v2/{name}/blobs/{layer['digest']}")
        if status != 200 or sha256(data) != layer["digest"]:
            raise SystemExit(f"release-oci: layer {title} of {a.ref}: status {status} or digest mismatch")
        with open(os.path.join(a.out, title), "wb") as f:
            f.write(data)
        written.append(title)
    return {"ref": a.ref, "files": written}


def cmd_chart(a) -> dict:
    import helm_python as helm

    os.makedirs(a.out, exist_ok=True)
    chart = a.chart
    if a.image:
        # The published chart's default image is the one pushed beside it: a copy of the
        # chart with image.repository rewritten (the only line of values.yaml that changes).
        copy = tempfile.mkdtemp()
        chart = os.path.join(copy, os.path.basename(a.chart.rstrip("/")))
        shutil.copytree(a.chart, chart)
        values = os.path.join(chart, "values.yaml")
        with open(values) as f:
            text = f.read()
        new, n = re.subn(r"(?m)^(image:\n(?:  #.*\n)*  repository: ).*$", lambda m: m.group(1) + a.image, text, count=1)
        if n != 1:
            raise SystemExit("values.yaml: no image.repository to set")
        with open(values, "w") as f:
            f.write(new)
    try:
        archive = helm.package(chart, destination=a.out)
    finally:
        if chart != a.chart:
            shutil.rmtree(os.path.dirname(chart), ignore_errors=True)
    host, _ = split_registry(a.registry)
    remote = f"oci://{a.registry.strip('/')}/charts"
    with helm.RegistryClient(plain_http=a.plain_http) as client:
        user, password = os.environ.get("REGISTRY_USERNAME"), os.environ.get("REGISTRY_PASSWORD")
        if user is not None and password is not None:
            client.login(host, user, password, plain_http=a.plain_http)
        pushed = client.push(archive, remote, plain_http=a.plain_http)
    return {"archive": archive, "remote": remote, "push": pushed}


def cmd_pull_chart(a) -> dict:
    import helm_python as helm

    os.makedirs(a.out, exist_ok=True)
    pulled = helm.pull(
        a.ref, version=a.version, destination=a.out, untar=True, untar_dir=a.out,
        plain_http=a.plain_http,
    )
    return {"dir": os.path.join(a.out, a.ref.rstrip("/").rsplit("/", 1)[-1]), "pull": pulled}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("chart")
    c.add_argument("chart")
    c.add_argument("--registry", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--plain-http", action="store_true")
    c.add_argument("--image", help="the image repository the published chart defaults to")
    s = sub.add_parser("sbom")
    s.add_argument("file")
    s.add_argument("--registry", required=True)
    s.add_argument("--repository", required=True)
    s.add_argument("--tag", required=True)
    s.add_argument("--subject-tag", required=True)
    s.add_argument("--plain-http", action="store_true")
    q = sub.add_parser("pull-chart")
    q.add_argument("ref")
    q.add_argument("--version", required=True)
    q.add_argument("--out", required=True)
    q.add_argument("--plain-http", action="store_true")
    r = sub.add_parser("artifact")
    r.add_argument("files", nargs="+")
    r.add_argument("--registry", required=True)
    r.add_argument("--repository", required=True)
    r.add_argument("--tag", required=True)
    r.add_argument("--artifact-type", required=True)
    r.add_argument("--plain-http", action="store_true")
    g = sub.add_parser("pull-artifact")
    g.add_argument("ref")
    g.add_argument("--out", required=True)
    g.add_argument("--plain-http", action="store_true")
    a = p.parse_args()
    run = {
        "chart": cmd_chart, "sbom": cmd_sbom, "pull-chart": cmd_pull_chart,
        "artifact": cmd_artifact, "pull-artifact": cmd_pull_artifact,
    }[a.command]
    print(json.dumps(run(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
