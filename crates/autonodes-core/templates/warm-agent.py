#!/usr/bin/env python3
# autonodes warm-VM agent (written by autonodes' user data; Python 3 standard library only).
#
# This VM is warm: booted, joined to no cluster. With this VM's own token (its Role reads
# only this VM's binding Secret, renews only this VM's Lease and deletes only this VM's
# ServiceAccount on the host cluster), the agent renews the Lease as a heartbeat and looks
# for the binding. Once a claim has written it, the agent writes the files it carries to
# fixed paths and revokes its own token (it deletes its ServiceAccount, and retries until
# that is done) before anything of the claim's runs: then cloud-init applies the claim's
# SSH keys, files and commands where the binding carries them (the `write_files`, `ssh`
# and `runcmd` modules), and the agent runs the prepare script and `kubeadm join` with the
# binding's configuration. It runs nothing else from the binding and reads nothing else.
#
# The join skips kubeadm's preflight phase: its checks are of this machine (swap, ports,
# binaries, the runtime, the hostname resolving), which the prepare script checks (and it
# makes the node's name resolve from /etc/hosts), and under software emulation they cost
# seconds.
import base64
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

DIR = "/etc/autonodes/warm"
CONFIG = DIR + "/config.json"
TOKEN = DIR + "/token"
HOST_CA = DIR + "/host-ca.crt"
KUBELET_PKI = "/var/lib/kubelet/pki"
# Binding key -> (path, mode). Nothing else in the binding is used.
FILES = {
    "kubeadm-join.yaml": ("/etc/kubernetes/kubeadm-join.yaml", 0o600),
    "prepare-node.sh": ("/etc/autonodes/prepare-node.sh", 0o755),
}
# Optional binding key -> (path, mode): the claim's SSH keys and user data, when this VM
# did not boot with them (a cloud-config that cloud-init reads with --file).
USER_DATA = ("user-data.json", DIR + "/binding-user-data.json", 0o600)
# The cloud-init modules that apply it to this running VM, in this order, each only where
# the config has its key (without it cloud-init would read this VM's boot config instead):
# `runcmd` writes the commands as a script, `scripts_user` runs it.
MODULES = (
    ("write_files", ("write_files",)),
    ("ssh_authorized_keys", ("ssh",)),
    ("runcmd", ("runcmd", "scripts_user")),
)
JOIN = (
    "/etc/autonodes/prepare-node.sh"
    " && kubeadm join --skip-phases=preflight --config /etc/kubernetes/kubeadm-join.yaml"
)


def log(message):
    print("autonodes-warm: " + message, file=sys.stderr, flush=True)


def call(cfg, method, path, body=None, content_type=None):
    with open(TOKEN) as f:
        token = f.read().strip()
    request = urllib.request.Request(cfg["server"].rstrip("/") + path, data=body, method=method)
    request.add_header("Authorization", "Bearer " + token)
    request.add_header("Accept", "application/json")
    if content_type:
        request.add_header("Content-Type", content_type)
    context = ssl.create_default_context(cafile=HOST_CA)
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        return json.load(response)


def heartbeat(cfg):
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = json.dumps({"spec": {"holderIdentity": cfg["vm"], "renewTime": now}}).encode()
    path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s" % (cfg["namespace"], cfg["lease"])
    call(cfg, "PATCH", path, body, "application/merge-patch+json")


def binding(cfg):
    path = "/api/v1/namespaces/%s/secrets/%s" % (cfg["namespace"], cfg["binding"])
    try:
        secret = call(cfg, "GET", path)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise
    data = secret.get("data") or {}
    return data if all(key in data for key in FILES) else None


def revoke(cfg):
    # Deletes this VM's ServiceAccount, which makes its token worthless everywhere (also
    # the copy in the cloud-init seed). Retried until the host says it is gone: nothing of
    # the claim's runs while the token still works.
    account = cfg.get("account", cfg["lease"])
    path = "/api/v1/namespaces/%s/serviceaccounts/%s" % (cfg["namespace"], account)
    last_error = None
    while True:
        try:
            call(cfg, "DELETE", path)
            return
        except urllib.error.HTTPError as e:
            if e.code in (401, 404):  # revoked already
                return
            error = "HTTP %d" % e.code
        except Exception as e:
            error = str(e)
        if error != last_error:
            log("revoking this VM's credential failed, retrying: %s" % error)
            last_error = error
        time.sleep(2)


def apply_user_data(path):
    # The claim's SSH keys, files and commands, applied by cloud-init to this running VM.
    # cloud-init may still be finishing this VM's first boot: it is waited for first (each
    # start of cloud-init costs seconds, so only where it has not said it finished).
    with open(path) as f:
        config = json.load(f)
    if not os.path.exists("/var/lib/cloud/instance/boot-finished"):
        subprocess.run(["cloud-init", "status", "--wait"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
    modules = [m for key, names in MODULES if config.get(key) for m in names]
    for module in modules:
        code = subprocess.call(["cloud-init", "--file", path, "single", "--name", module,
                                "--frequency", "always"])
        if code != 0:
            log("cloud-init module %s of the claim's user data failed (exit %d)" % (module, code))
    log("applied the claim's user data")


def serving_certificate():
    # A kubelet that is neither given a serving certificate nor told to request one makes
    # itself a self-signed one for this machine's name at its first start, in its
    # certificate directory: two RSA keys, seconds under software emulation. The same kind
    # of certificate (with an EC key) is made here while waiting. A kubelet configured
    # otherwise does not read it.
    crt, key = KUBELET_PKI + "/kubelet.crt", KUBELET_PKI + "/kubelet.key"
    if os.path.exists(crt) or os.path.exists(key):
        return
    name = socket.gethostname()
    os.makedirs(KUBELET_PKI, mode=0o755, exist_ok=True)
    subprocess.run(
        ["openssl", "req", "-x509", "-nodes", "-days", "365",
         "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-keyout", key + ".part", "-out", crt + ".part",
         "-subj", "/CN=%s@%d" % (name, int(time.time())),
         "-addext", "subjectAltName=DNS:" + name,
         "-addext", "keyUsage=critical,digitalSignature,keyEncipherment",
         "-addext", "extendedKeyUsage=serverAuth"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=True)
    os.chmod(key + ".part", 0o600)
    os.rename(key + ".part", key)
    os.rename(crt + ".part", crt)


def warm_up():
    # What does not depend on the tenant, done while waiting: the kubelet and kubeadm read
    # once from disk (a join then starts them from memory), containerd answering. Failures
    # do not matter here: the prepare script checks all of it at join time.
    for cmd in (
        ["kubelet", "--version"],
        ["kubeadm", "version", "-o", "short"],
        ["ctr", "--address", "/run/containerd/containerd.sock", "version"],
    ):
        try:
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
        except Exception:
            pass
    log("warmed up")


def main():
    if not os.path.exists(TOKEN):
        # The token goes when a claim binds this VM: the agent ran the join before and is
        # restarted after it failed. The claim's registration timeout deals with that.
        log("bound before: nothing to do")
        return
    # An image's kubelet service, enabled but with no configuration before the join, fails
    # and restarts every few seconds, and each start costs the VM and its host seconds of
    # CPU. It is stopped while the VM is warm (before anything else, so never after the
    # join started it); the join's kubelet-start step starts it.
    try:
        subprocess.run(["systemctl", "stop", "kubelet.service"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60)
    except Exception:
        pass
    # Before the binding is read, so that no kubelet starts while it is being written.
    try:
        serving_certificate()
    except Exception as e:
        log("kubelet serving certificate not made (the kubelet makes its own): %s" % e)
    threading.Thread(target=warm_up, daemon=True).start()
    with open(CONFIG) as f:
        cfg = json.load(f)
    poll = float(cfg.get("pollSeconds", 1))
    every = float(cfg.get("heartbeatSeconds", 5))
    next_beat = 0.0
    last_error = None
    while True:
        try:
            if time.monotonic() >= next_beat:
                heartbeat(cfg)
                next_beat = time.monotonic() + every
            data = binding(cfg)
            last_error = None
        except Exception as e:  # unreachable or refused: say so once, keep trying
            if str(e) != last_error:
                log("host API server %s: %s" % (cfg["server"], e))
                last_error = str(e)
            data = None
        if data is not None:
            break
        time.sleep(poll)
    files = list(FILES.items())
    if USER_DATA[0] in data:
        files.append((USER_DATA[0], USER_DATA[1:]))
    for key, (path, mode) in files:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(base64.b64decode(data[key]))
        os.chmod(path, mode)
    revoke(cfg)
    os.remove(TOKEN)
    log("bound by a claim: its credential revoked")
    if USER_DATA[0] in data:
        try:
            apply_user_data(USER_DATA[1])
        except Exception as e:
            log("the claim's user data was not applied: %s" % e)
    log("joining")
    sys.exit(subprocess.call(["sh", "-c", JOIN]))


if __name__ == "__main__":
    main()
