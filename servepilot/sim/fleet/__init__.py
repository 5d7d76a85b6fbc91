"""The fleet simulator: clients, network hops, the gateway's real routing and admission
objects, N simulated replicas and the autoscaling hook, event by event."""
