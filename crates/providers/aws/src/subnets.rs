//! Which subnets a load balancer goes into, chosen as upstream's `findELBSubnets`: subnets of
//! the VPC not tagged for another cluster (role tags alone suffice, as on EKS since 1.19), only
//! those with an internet-gateway route for an internet-facing LB, one per zone preferring the
//! role tag, then the cluster tag, then the lowest subnet id; local, wavelength and outpost
//! zones skipped (they take no CLB or NLB).
