"""The ingress library every service mounts: errors, request ids, auth, limits, quota gate."""
