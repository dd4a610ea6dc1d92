"""The sidecar's Prometheus metrics, in a registry of its own (tests run several sidecars in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class SidecarMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.events = Counter("topology_agent_watch_events_total", "Watch events seen, by type", ["type"],
                              registry=r)
        self.rewrites = Counter("topology_agent_rewrites_total", "Generations of files written", registry=r)
        self.signals = Counter("topology_agent_signals_total", "Signals to the trainer, by result", ["result"],
                               registry=r)
        self.watch_restarts = Counter("topology_agent_watch_restarts_total", "Watches ended or broken and resumed",
                                      registry=r)
        self.relists = Counter("topology_agent_relists_total", "LISTs after the first (410 Gone)", registry=r)
        self.published = Counter("topology_agent_published_changes_total",
                                 "Journal writes made while this pod led the publication", registry=r)
        self.leading = Gauge("topology_agent_leading", "1 while this pod holds the publisher Lease", registry=r)
        self.generation = Gauge("topology_agent_generation", "Generation of the files in place", registry=r)
        self.latency = Histogram(
            "topology_agent_event_to_file_seconds", "From the first event of a change to its files renamed",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0), registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
