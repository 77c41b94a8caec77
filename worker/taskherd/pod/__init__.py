"""What Kubernetes runs beside a worker in its pod: `taskherd probe` (exec probes), `taskherd drain`
(the preStop hook), and the files they share with the worker (heartbeat.json, drain-request.json).

Standard library only and import-light: the kubelet runs these every few seconds in every pod.
"""
