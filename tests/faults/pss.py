"""Kubernetes Pod Security Standards, "restricted" profile (which includes "baseline"),
applied to a pod spec the way the Kubernetes documentation lists the controls
(https://kubernetes.io/docs/concepts/security/pod-security-standards/), independently of
how our manifests are generated.

Each control names the restricted fields and the values allowed there; a pod violates the
profile if any field of the pod or of any of its containers (containers, initContainers,
ephemeralContainers) holds another value. Controls marked "optional" in older versions of
the page (AppArmor, SELinux) are applied too. Windows pods (spec.os.name: windows) are
not special-cased: we never make one.
"""

from __future__ import annotations

# Baseline: capabilities that may be added beyond the runtime's default set.
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
# Restricted: the only capability that may be added (and ALL must be dropped).
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
# Baseline: the "safe" sysctls (namespaced, isolated from other pods on the node).
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SELINUX_TYPES = frozenset(
    {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
)
# Restricted: the volume types a pod may use (core types and PersistentVolume-backed ones).
VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")


def restricted_violations(pod_spec: dict) -> list[str]:
    """What in `pod_spec` breaks Pod Security "restricted", one line per violation (empty:
    none). `pod_spec` is a Pod's `spec`, or a Pod or pod template with `metadata` and
    `spec` (then the AppArmor annotations are checked too)."""
    if "containers" not in pod_spec and isinstance(pod_spec.get("spec"), dict):
        metadata, spec = pod_spec.get("metadata") or {}, pod_spec["spec"]
    else:
        metadata, spec = {}, pod_spec
    found: list[str] = []
    pod_sc = spec.get("securityContext") or {}
    containers = [
        (f"{kind}[{c.get('name', i)}]", c)
        for kind in ("containers", "initContainers", "ephemeralContainers")
        for i, c in enumerate(spec.get(kind) or [])
    ]
    if not spec.get("containers"):
        found.append("spec.containers: a pod has at least one container")

    # --- baseline ---------------------------------------------------------------------
    # HostProcess
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess") not in (None, False):
        found.append("spec.securityContext.windowsOptions.hostProcess: must be unset or false")
    for where, c in containers:
        sc = c.get("securityContext") or {}
        if (sc.get("windowsOptions") or {}).get("hostProcess") not in (None, False):
            found.append(f"{where}.securityContext.windowsOptions.hostProcess: unset or false")
    # Host namespaces
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field) not in (None, False):
            found.append(f"spec.{field}: host namespaces must not be shared")
    # Privileged containers
    for where, c in containers:
        if (c.get("securityContext") or {}).get("privileged") not in (None, False):
            found.append(f"{where}.securityContext.privileged: must be unset or false")
    # Capabilities (baseline: only the default set may be added)
    for where, c in containers:
        added = ((c.get("securityContext") or {}).get("capabilities") or {}).get("add") or []
        for capability in added:
            if capability not in BASELINE_CAPABILITIES:
                found.append(
                    f"{where}.securityContext.capabilities.add: {capability} is not allowed"
                )
    # HostPath volumes
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            found.append(
                f"spec.volumes[{volume.get('name')}].hostPath: hostPath volumes are forbidden"
            )
    # Host ports
    for where, c in containers:
        for port in c.get("ports") or []:
            if port.get("hostPort") not in (None, 0):
                found.append(
                    f"{where}.ports.hostPort: {port.get('hostPort')} (host ports are disallowed)"
                )
    # Host probes and lifecycle hooks: no `host` other than the pod's own
    for where, c in containers:
        handlers = [(p, c.get(p)) for p in PROBES]
        handlers += [(f"lifecycle.{h}", (c.get("lifecycle") or {}).get(h)) for h in HOOKS]
        for name, handler in handlers:
            for kind in ("httpGet", "tcpSocket"):
                host = ((handler or {}).get(kind) or {}).get("host")
                if host not in (None, ""):
                    found.append(f"{where}.{name}.{kind}.host: {host!r} must be unset or empty")
    # AppArmor
    if (pod_sc.get("appArmorProfile") or {}).get("type") not in (None, *APPARMOR_ALLOWED):
        found.append("spec.securityContext.appArmorProfile.type: RuntimeDefault or Localhost")
    for where, c in containers:
        profile = ((c.get("securityContext") or {}).get("appArmorProfile") or {}).get("type")
        if profile not in (None, *APPARMOR_ALLOWED):
            found.append(
                f"{where}.securityContext.appArmorProfile.type: RuntimeDefault or Localhost"
            )
    for key, value in (metadata.get("annotations") or {}).items():
        allowed = value == "runtime/default" or str(value).startswith("localhost/")
        if key.startswith(APPARMOR_ANNOTATION) and not allowed:
            found.append(f"metadata.annotations[{key}]: {value!r} (runtime/default or localhost/*)")
    # SELinux
    contexts = [("spec.securityContext", pod_sc)]
    contexts += [
        (f"{where}.securityContext", c.get("securityContext") or {}) for where, c in containers
    ]
    for where, sc in contexts:
        options = sc.get("seLinuxOptions") or {}
        if options.get("type") not in (None, *SELINUX_TYPES):
            found.append(f"{where}.seLinuxOptions.type: {options.get('type')!r} is not allowed")
        for field in ("user", "role"):
            if options.get(field) not in (None, ""):
                found.append(f"{where}.seLinuxOptions.{field}: must be unset or empty")
    # /proc mount type
    for where, c in containers:
        if (c.get("securityContext") or {}).get("procMount") not in (None, "Default"):
            found.append(f"{where}.securityContext.procMount: must be unset or Default")
    # Seccomp (baseline: Unconfined is forbidden wherever it is set)
    for where, sc in contexts:
        kind = (sc.get("seccompProfile") or {}).get("type")
        if kind is not None and kind not in SECCOMP_ALLOWED:
            found.append(f"{where}.seccompProfile.type: {kind!r} (RuntimeDefault or Localhost)")
    # Sysctls
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"spec.securityContext.sysctls: {sysctl.get('name')} is not a safe sysctl")

    # --- restricted -------------------------------------------------------------------
    # Volume types
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds or not kinds <= VOLUME_TYPES:
            found.append(
                f"spec.volumes[{volume.get('name')}]: {sorted(kinds)} is not an allowed volume type"
            )
    # Privilege escalation: must be set to false
    for where, c in containers:
        if (c.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}.securityContext.allowPrivilegeEscalation: must be false")
    # Running as non-root: the pod says true (and no container says false), or every
    # container says true
    pod_non_root = pod_sc.get("runAsNonRoot")
    if pod_non_root not in (None, True):
        found.append("spec.securityContext.runAsNonRoot: must be true")
    for where, c in containers:
        own = (c.get("securityContext") or {}).get("runAsNonRoot")
        if own is False or (own is None and pod_non_root is not True):
            found.append(
                f"{where}.securityContext.runAsNonRoot: must be true (here or for the pod)"
            )
    # Running as a non-root user
    for where, sc in contexts:
        if sc.get("runAsUser") == 0:
            found.append(f"{where}.runAsUser: 0 (root) is not allowed")
    # Seccomp (restricted): set to an allowed type for the pod, or for every container
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp not in SECCOMP_ALLOWED:
        for where, c in containers:
            own = ((c.get("securityContext") or {}).get("seccompProfile") or {}).get("type")
            if own is None:
                found.append(f"{where}.securityContext.seccompProfile.type: set it (or the pod's)")
    # Capabilities (restricted): drop ALL, add at most NET_BIND_SERVICE
    for where, c in containers:
        capabilities = (c.get("securityContext") or {}).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            found.append(f"{where}.securityContext.capabilities.drop: must include ALL")
        for capability in capabilities.get("add") or []:
            if capability not in RESTRICTED_CAPABILITIES:
                where_add = f"{where}.securityContext.capabilities.add"
                found.append(f"{where_add}: {capability} (NET_BIND_SERVICE only)")
    return found


def pod_templates(manifest: dict) -> list[dict]:
    """The pod templates (metadata and spec) in a Pod, a Job or a JobSet manifest."""
    kind = manifest.get("kind")
    if kind == "Pod":
        return [manifest]
    if kind == "Job":
        return [manifest["spec"]["template"]]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"] for r in manifest["spec"]["replicatedJobs"]]
    raise ValueError(f"no pod template in a {kind!r}")
