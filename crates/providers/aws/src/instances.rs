//! Instances: batched `DescribeInstances`, providerIDs, node addresses in upstream's order,
//! existence and shutdown.

use std::borrow::Borrow;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName, NetworkInterfaceStatus};
use ccm_cloud::{
    CloudError, CloudResult, InstanceMetadata, InstanceStatus, Instances, Node, NodeAddress,
    node_name, node_provider_id,
};

use crate::cloud::{AwsCloud, Known};
use crate::config::IpFamily;
use crate::error;
use crate::providerid::{NodeKind, classify, instance_id_name, provider_id};

/// Instance ids per `DescribeInstances` call (the API's limit for `InstanceIds`).
pub const MAX_IDS_PER_CALL: usize = 1000;
/// Names per `private-dns-name` filter: EC2 allows 200; upstream uses 150, so do we.
const MAX_FILTER_VALUES: usize = 150;
/// Upstream's `topology.k8s.aws/zone-id` label.
pub const LABEL_ZONE_ID: &str = "topology.k8s.aws/zone-id";
/// The code EC2 answers when any id in `InstanceIds` does not exist.
const NOT_FOUND: &str = "InvalidInstanceID.NotFound";
/// How long an instance found by name answers further lookups of that name. A burst asks for
/// the same new Nodes from several controllers (cloud-node, route, service) over some seconds;
/// one answer — a 150-name filter or a listing of the VPC — serves all of them. (Upstream
/// asks EC2 by name for each Node's metadata and again for each route.)
pub(crate) const BY_NAME_TTL: Duration = Duration::from_secs(20);
/// Instance states a Node can belong to (upstream's `aliveFilter`: not terminated).
const ALIVE: [&str; 5] = ["pending", "running", "shutting-down", "stopping", "stopped"];

/// The instances a lookup by name (or a VPC listing) saw under one private DNS name, and when.
/// More than one is an error for that name: no guessing which is the Node.
pub(crate) struct Seen {
    at: Instant,
    insts: Vec<Instance>,
}

/// Lookups queued while another `DescribeInstances` is in flight; the next caller to get the
/// flight lock answers all of them with one call (per 1,000 ids / 150 names), so a burst of
/// Nodes arriving in many small controller batches still costs the cloud a handful of calls.
#[derive(Default)]
pub(crate) struct Pending {
    ids: BTreeSet<String>,
    names: BTreeSet<String>,
    waiters: Vec<oneshot::Sender<Arc<Found>>>,
}

/// The answer to one coalesced lookup.
pub(crate) struct Found {
    pub by_id: CloudResult<ById>,
    /// Live instances per private DNS name (more than one: ambiguous).
    pub by_name: CloudResult<HashMap<String, Vec<Instance>>>,
}

/// Instances by id, and the ids EC2 answered `InvalidInstanceID.NotFound` for: only those are
/// known to be gone. An id in neither is unknown (an error for its Node, never "gone").
#[derive(Default, Clone)]
pub(crate) struct ById {
    pub found: HashMap<String, Instance>,
    pub not_found: BTreeSet<String>,
}

/// How a Node is found in EC2.
enum Key {
    Id(String),
    Name(String),
    /// A Fargate or hybrid Node: no EC2 instance to look up.
    NotEc2,
    Bad(CloudError),
}

fn key(node: &Node) -> Key {
    let pid = node_provider_id(node);
    if pid.is_empty() {
        let name = node_name(node);
        return match instance_id_name(name) {
            Some(id) => Key::Id(id.to_string()),
            None => Key::Name(name.to_string()),
        };
    }
    match classify(pid) {
        Ok(NodeKind::Ec2(id)) => Key::Id(id.to_string()),
        Ok(kind) => {
            tracing::debug!(
                node = node_name(node),
                provider_id = pid,
                ?kind,
                "not an EC2 instance; skipped"
            );
            Key::NotEc2
        }
        Err(e) => Key::Bad(e),
    }
}

/// The error for a Node name more than one live instance of the cluster answers to.
fn ambiguous(name: &str, insts: &[Instance]) -> CloudError {
    let ids: Vec<&str> = insts.iter().filter_map(|i| i.instance_id()).collect();
    CloudError::Permanent(format!(
        "node {name:?}: {} live instances of the cluster have this private DNS name ({}); set the Node's spec.providerID, or restrict the lookup with VPC / KubernetesClusterID in --cloud-config",
        ids.len(),
        ids.join(", ")
    ))
}

/// Node addresses of an instance in upstream's order: per address family asked for, IPv4 gives
/// the private IPs of in-use interfaces by device index, the public IP, the private DNS name
/// (as InternalDNS and Hostname) and the public DNS name; IPv6 gives the first IPv6 address of
/// each in-use interface.
pub fn node_addresses(inst: &Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let addr = |t: &str, a: &str| NodeAddress {
        type_: t.to_string(),
        address: a.to_string(),
    };
    let mut enis: Vec<_> = inst
        .network_interfaces()
        .iter()
        .filter(|n| n.status() == Some(&NetworkInterfaceStatus::InUse))
        .collect();
    enis.sort_by_key(|n| {
        n.attachment()
            .and_then(|a| a.device_index())
            .unwrap_or(i32::MAX)
    });
    let mut out = Vec::new();
    for family in families {
        match family {
            IpFamily::Ipv4 => {
                let mut private: Vec<&str> = enis
                    .iter()
                    .flat_map(|n| n.private_ip_addresses())
                    .filter_map(|p| p.private_ip_address())
                    .collect();
                if private.is_empty()
                    && let Some(ip) = inst.private_ip_address()
                {
                    private.push(ip);
                }
                out.extend(private.into_iter().map(|ip| addr("InternalIP", ip)));
                if let Some(ip) = inst.public_ip_address().filter(|s| !s.is_empty()) {
                    out.push(addr("ExternalIP", ip));
                }
                if let Some(dns) = inst.private_dns_name().filter(|s| !s.is_empty()) {
                    out.push(addr("InternalDNS", dns));
                    out.push(addr("Hostname", dns));
                }
                if let Some(dns) = inst.public_dns_name().filter(|s| !s.is_empty()) {
                    out.push(addr("ExternalDNS", dns));
                }
            }
            IpFamily::Ipv6 => out.extend(
                enis.iter()
                    .filter_map(|n| n.ipv6_addresses().first())
                    .filter_map(|a| a.ipv6_address())
                    .map(|ip| addr("InternalIP", ip)),
            ),
        }
    }
    out
}

fn state(inst: &Instance) -> Option<&InstanceStateName> {
    inst.state().and_then(|s| s.name())
}

/// What a lookup learned about one Node.
enum Lookup {
    /// The instance, as EC2 returned it (terminated included).
    Instance(Box<Instance>),
    /// EC2 answered `InvalidInstanceID.NotFound` for the Node's instance id: gone.
    Gone,
    /// A Fargate or hybrid Node: no EC2 instance to ask about.
    NotEc2,
}

/// One Node's answer. Only EC2's own word about the Node's instance id is "gone"; a name no
/// instance answers to, or an id EC2 left out without saying, is an error (the Node stays).
fn resolve(k: Key, found: &Found) -> CloudResult<Lookup> {
    match k {
        Key::Id(id) => {
            let by_id = found.by_id.as_ref().map_err(Clone::clone)?;
            if let Some(inst) = by_id.found.get(&id) {
                Ok(Lookup::Instance(Box::new(inst.clone())))
            } else if by_id.not_found.contains(&id) {
                Ok(Lookup::Gone)
            } else {
                Err(CloudError::Transient(format!(
                    "DescribeInstances did not answer for {id}; asking again later"
                )))
            }
        }
        Key::Name(n) => {
            let by_name = found.by_name.as_ref().map_err(Clone::clone)?;
            match by_name.get(&n).map(Vec::as_slice) {
                Some([one]) => Ok(Lookup::Instance(Box::new(one.clone()))),
                Some(many) if many.len() > 1 => Err(ambiguous(&n, many)),
                _ => Err(CloudError::InstanceNotFound),
            }
        }
        Key::NotEc2 => Ok(Lookup::NotEc2),
        Key::Bad(e) => Err(e),
    }
}

fn status_of(inst: Option<&Instance>) -> InstanceStatus {
    let state = inst.and_then(state);
    // As upstream: only `terminated` is gone; `shutting-down` still exists (its Node stays
    // until EC2 reports it terminated).
    let terminated = matches!(state, Some(InstanceStateName::Terminated));
    InstanceStatus {
        exists: inst.is_some() && !terminated,
        shutdown: !terminated
            && matches!(
                state,
                Some(InstanceStateName::Stopped) | Some(InstanceStateName::Stopping)
            ),
    }
}

fn known(inst: &Instance) -> Known {
    Known {
        vpc: inst.vpc_id().unwrap_or_default().to_string(),
        source_dest_check: inst.source_dest_check(),
        security_groups: inst
            .security_groups()
            .iter()
            .filter_map(|g| g.group_id().map(String::from))
            .collect(),
    }
}

fn zone_of(inst: &Instance) -> &str {
    inst.placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or_default()
}

/// Instance ids named in an `InvalidInstanceID.NotFound` message
/// (`The instance IDs 'i-1, i-2' do not exist`).
pub(crate) fn ids_in_message(message: &str) -> Vec<String> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("i-") && w.len() > 2)
        .map(String::from)
        .collect()
}

impl AwsCloud {
    /// One `DescribeInstances` (all pages) by ids or by filters.
    async fn describe_pages(
        &self,
        ids: Option<Vec<String>>,
        filters: Option<Vec<Filter>>,
    ) -> Result<
        Vec<Instance>,
        aws_sdk_ec2::error::SdkError<
            aws_sdk_ec2::operation::describe_instances::DescribeInstancesError,
            aws_sdk_ec2::config::http::HttpResponse,
        >,
    > {
        let ec2 = match self.clients().await {
            Ok(c) => c.ec2.clone(),
            Err(e) => {
                return Err(aws_sdk_ec2::error::SdkError::construction_failure(e));
            }
        };
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut req = ec2
                .describe_instances()
                .set_instance_ids(ids.clone())
                .set_filters(filters.clone())
                .set_next_token(token.take());
            if ids.is_none() {
                req = req.max_results(1000);
            }
            let page = self.call_raw("DescribeInstances", req.send()).await?;
            out.extend(
                page.reservations()
                    .iter()
                    .flat_map(|r| r.instances().iter().cloned()),
            );
            match page.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => return Ok(out),
            }
        }
    }

    /// Instances by id, at most [`MAX_IDS_PER_CALL`] per call. Ids EC2 does not know are left
    /// out (one more call per chunk that has any, since EC2 fails the whole call for them).
    pub(crate) async fn describe_ids(&self, ids: &[String]) -> CloudResult<ById> {
        let mut out = ById::default();
        for chunk in ids.chunks(MAX_IDS_PER_CALL) {
            let mut want: Vec<String> = chunk.to_vec();
            want.sort();
            want.dedup();
            while !want.is_empty() {
                match self.describe_pages(Some(want.clone()), None).await {
                    Ok(list) => {
                        for inst in list {
                            if let Some(id) = inst.instance_id() {
                                out.found.insert(id.to_string(), inst);
                            }
                        }
                        break;
                    }
                    Err(e) if error::code(&e) == Some(NOT_FOUND) => {
                        let missing = ids_in_message(
                            aws_sdk_ec2::error::ProvideErrorMetadata::message(&e).unwrap_or(""),
                        );
                        let before = want.len();
                        want.retain(|id| !missing.contains(id));
                        if want.len() == before {
                            return Err(error::map("DescribeInstances", e));
                        }
                        out.not_found
                            .extend(missing.into_iter().filter(|m| chunk.contains(m)));
                    }
                    Err(e) => return Err(error::map("DescribeInstances", e)),
                }
            }
        }
        self.remember(out.found.values());
        Ok(out)
    }

    /// Live instances of the cluster by private DNS name (upstream's lookup for Nodes without
    /// providerID), restricted to the cluster's VPC when known and to its cluster tag. Names
    /// seen in the last [`BY_NAME_TTL`] cost nothing; up to 150 others cost one
    /// `private-dns-name` call; more than that list the VPC (1,000 instances a page) — after
    /// one name call that tells which VPC when neither the cloud-config nor memory knows.
    pub(crate) async fn describe_names(
        &self,
        names: &[String],
    ) -> CloudResult<HashMap<String, Vec<Instance>>> {
        let mut out = self.seen(names);
        let mut rest: Vec<String> = names
            .iter()
            .filter(|n| !out.contains_key(*n))
            .cloned()
            .collect();
        if rest.len() > MAX_FILTER_VALUES && self.known_vpc().is_none() {
            let first: Vec<String> = rest.drain(..MAX_FILTER_VALUES).collect();
            out.extend(self.describe_by_dns_name(&first).await?);
        }
        if !rest.is_empty() {
            let found = match self.known_vpc().filter(|_| rest.len() > MAX_FILTER_VALUES) {
                Some(vpc) => {
                    self.list_vpc(&vpc).await?;
                    self.seen(&rest)
                }
                None => self.describe_by_dns_name(&rest).await?,
            };
            out.extend(found);
        }
        self.note_names(&out);
        Ok(out)
    }

    /// Remembers which instance each Node name is (names with exactly one instance).
    fn note_names(&self, found: &HashMap<String, Vec<Instance>>) {
        let mut mem = self.inner.memory.lock();
        for (name, insts) in found {
            if let [inst] = insts.as_slice()
                && let Some(id) = inst.instance_id()
            {
                mem.node_to_instance.insert(name.clone(), id.to_string());
                mem.instance_to_node.insert(id.to_string(), name.clone());
            }
        }
        drop(mem);
        self.remember(found.values().flatten());
    }

    /// The instances seen by name in the last [`BY_NAME_TTL`] for `names`; older ones are
    /// dropped.
    fn seen(&self, names: &[String]) -> HashMap<String, Vec<Instance>> {
        let mut mem = self.inner.memory.lock();
        mem.by_name.retain(|_, s| s.at.elapsed() < BY_NAME_TTL);
        names
            .iter()
            .filter_map(|n| mem.by_name.get(n).map(|s| (n.clone(), s.insts.clone())))
            .collect()
    }

    /// Keeps what one call just returned for lookups by name, grouped by private DNS name.
    fn saw(&self, insts: &[Instance]) {
        let at = Instant::now();
        let mut grouped: HashMap<&str, Vec<Instance>> = HashMap::new();
        for inst in insts {
            if let Some(dns) = inst.private_dns_name().filter(|d| !d.is_empty()) {
                grouped.entry(dns).or_default().push(inst.clone());
            }
        }
        let mut mem = self.inner.memory.lock();
        for (dns, insts) in grouped {
            mem.by_name.insert(dns.to_string(), Seen { at, insts });
        }
    }

    fn alive() -> Filter {
        Filter::builder()
            .name("instance-state-name")
            .set_values(Some(ALIVE.map(String::from).to_vec()))
            .build()
    }

    /// Filters that keep a lookup by name inside the cluster: its VPC when known, and its
    /// cluster tag when the cluster id is known (upstream's `tagging.addFilters`).
    fn cluster_filters(&self) -> Vec<Filter> {
        let mut out = vec![Self::alive()];
        if let Some(vpc) = self.known_vpc() {
            out.push(Filter::builder().name("vpc-id").values(vpc).build());
        }
        if let Some(c) = self.cluster() {
            out.push(c.filter());
        }
        out
    }

    /// One `private-dns-name` filter per 150 names.
    async fn describe_by_dns_name(
        &self,
        names: &[String],
    ) -> CloudResult<HashMap<String, Vec<Instance>>> {
        let wanted: BTreeSet<&str> = names.iter().map(String::as_str).collect();
        let mut out: HashMap<String, Vec<Instance>> = HashMap::new();
        for chunk in names.chunks(MAX_FILTER_VALUES) {
            let by_name = Filter::builder()
                .name("private-dns-name")
                .set_values(Some(chunk.to_vec()))
                .build();
            let mut filters = self.cluster_filters();
            filters.push(by_name);
            let list = self
                .describe_pages(None, Some(filters))
                .await
                .map_err(|e| error::map("DescribeInstances", e))?;
            self.remember(list.iter());
            self.saw(&list);
            for inst in list {
                if let Some(dns) = inst.private_dns_name().filter(|d| wanted.contains(d)) {
                    out.entry(dns.to_string()).or_default().push(inst);
                }
            }
        }
        Ok(out)
    }

    /// Lists every live instance of the cluster in `vpc`, kept for lookups by name for
    /// [`BY_NAME_TTL`].
    async fn list_vpc(&self, vpc: &str) -> CloudResult<()> {
        let mut filters = self.cluster_filters();
        if self.inner.cfg.vpc.is_none() && self.known_vpc().as_deref() != Some(vpc) {
            filters.push(Filter::builder().name("vpc-id").values(vpc).build());
        }
        let list = self
            .describe_pages(None, Some(filters))
            .await
            .map_err(|e| error::map("DescribeInstances", e))?;
        self.remember(list.iter());
        self.saw(&list);
        Ok(())
    }

    /// The cluster's VPC: the cloud-config's, else the one VPC every known instance is in.
    pub(crate) fn known_vpc(&self) -> Option<String> {
        if let Some(v) = &self.inner.cfg.vpc {
            return Some(v.clone());
        }
        let mem = self.inner.memory.lock();
        let vpcs: BTreeSet<&str> = mem
            .instances
            .values()
            .map(|k| k.vpc.as_str())
            .filter(|v| !v.is_empty())
            .collect();
        (vpcs.len() == 1).then(|| vpcs.into_iter().next().unwrap_or_default().to_string())
    }

    fn remember<'a>(&self, insts: impl Iterator<Item = &'a Instance>) {
        let mut mem = self.inner.memory.lock();
        for inst in insts {
            if let Some(id) = inst.instance_id() {
                mem.instances.insert(id.to_string(), known(inst));
            }
        }
    }

    /// Queues `ids` and `names` and waits for a `DescribeInstances` that includes them: its own
    /// when no call is in flight, else the next one, shared with every lookup queued meanwhile.
    pub(crate) async fn coalesced(&self, ids: Vec<String>, names: Vec<String>) -> Arc<Found> {
        // (Also drops what is no longer fresh, so a quiet cluster keeps no instances around.)
        let hit = self.seen(&names);
        if ids.is_empty() && !names.is_empty() && hit.len() == names.len() {
            self.note_names(&hit);
            return Arc::new(Found {
                by_id: Ok(ById::default()),
                by_name: Ok(hit),
            });
        }
        let (tx, mut rx) = oneshot::channel();
        {
            let mut p = self.inner.pending.lock();
            p.ids.extend(ids);
            p.names.extend(names);
            p.waiters.push(tx);
        }
        // Lookups started together (a refresh's chunks, joined) queue before the first flies.
        tokio::task::yield_now().await;
        let _flight = self.inner.flight.lock().await;
        if let Ok(done) = rx.try_recv() {
            return done;
        }
        let batch = std::mem::take(&mut *self.inner.pending.lock());
        let ids: Vec<String> = batch.ids.into_iter().collect();
        let names: Vec<String> = batch.names.into_iter().collect();
        let found = Arc::new(Found {
            by_id: if ids.is_empty() {
                Ok(ById::default())
            } else {
                self.describe_ids(&ids).await
            },
            by_name: if names.is_empty() {
                Ok(HashMap::new())
            } else {
                self.describe_names(&names).await
            },
        });
        for w in batch.waiters {
            let _ = w.send(found.clone());
        }
        // Our own sender was in the batch; the fallback only guards against a logic slip.
        rx.await.unwrap_or(found)
    }

    /// Instances by id through the shared batcher ([`AwsCloud::coalesced`]); ids EC2 does not
    /// know are left out.
    pub(crate) async fn instances_by_id(
        &self,
        ids: Vec<String>,
    ) -> CloudResult<HashMap<String, Instance>> {
        self.coalesced(ids, Vec::new())
            .await
            .by_id
            .clone()
            .map(|b| b.found)
    }

    /// Live instances of the cluster by Node name (private DNS name) through the shared
    /// batcher. A name more than one instance answers to is left out (callers that must tell
    /// the user use [`AwsCloud::instance_by_name`]).
    pub(crate) async fn instances_by_name(
        &self,
        names: Vec<String>,
    ) -> CloudResult<HashMap<String, Instance>> {
        let found = self.coalesced(Vec::new(), names).await;
        let by_name = found.by_name.as_ref().map_err(Clone::clone)?;
        Ok(by_name
            .iter()
            .filter_map(|(n, insts)| match insts.as_slice() {
                [one] => Some((n.clone(), one.clone())),
                _ => None,
            })
            .collect())
    }

    /// The one live instance of the cluster named `name`: `Ok(None)` for none, an error naming
    /// the instances for several.
    pub(crate) async fn instance_by_name(&self, name: &str) -> CloudResult<Option<Instance>> {
        let found = self.coalesced(Vec::new(), vec![name.to_string()]).await;
        let by_name = found.by_name.as_ref().map_err(Clone::clone)?;
        match by_name.get(name).map(Vec::as_slice) {
            None | Some([]) => Ok(None),
            Some([one]) => Ok(Some(one.clone())),
            Some(many) => Err(ambiguous(name, many)),
        }
    }

    /// The instance behind each Node, in two calls at most per 1,000 Nodes: one by id for
    /// Nodes with a providerID (or an instance-id name), one by name for the rest.
    async fn lookup<N: Borrow<Node>>(&self, nodes: &[N]) -> Vec<CloudResult<Lookup>> {
        let keys: Vec<Key> = nodes.iter().map(|n| key(n.borrow())).collect();
        let ids: Vec<String> = keys
            .iter()
            .filter_map(|k| match k {
                Key::Id(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let names: Vec<String> = keys
            .iter()
            .filter_map(|k| match k {
                Key::Name(n) => Some(n.clone()),
                _ => None,
            })
            .collect();
        let found = if ids.is_empty() && names.is_empty() {
            Arc::new(Found {
                by_id: Ok(ById::default()),
                by_name: Ok(HashMap::new()),
            })
        } else {
            self.coalesced(ids, names).await
        };
        {
            let mut mem = self.inner.memory.lock();
            for (node, k) in nodes.iter().map(Borrow::borrow).zip(&keys) {
                match k {
                    Key::Id(id) => {
                        mem.node_to_instance
                            .insert(node_name(node).to_string(), id.clone());
                        mem.instance_to_node
                            .insert(id.clone(), node_name(node).to_string());
                    }
                    Key::NotEc2 => {
                        mem.not_ec2.insert(node_name(node).to_string());
                    }
                    _ => {}
                }
            }
        }
        keys.into_iter().map(|k| resolve(k, &found)).collect()
    }

    /// Zone ids for the zones of `insts` that the instances themselves do not carry: one
    /// `DescribeAvailabilityZones` the first time, remembered after.
    async fn zone_ids(&self, insts: &[&Instance]) -> CloudResult<HashMap<String, String>> {
        let missing = || {
            insts.iter().any(|i| {
                i.placement()
                    .and_then(|p| p.availability_zone_id())
                    .is_none()
                    && !self.inner.memory.lock().zone_ids.contains_key(zone_of(i))
            })
        };
        // One call for lookups that find the zone ids missing together (a burst's batches).
        let _one = if missing() {
            Some(self.inner.zone_flight.lock().await)
        } else {
            None
        };
        if missing() {
            self.learn_zones().await?;
        }
        Ok(self.inner.memory.lock().zone_ids.clone())
    }

    /// One `DescribeAvailabilityZones` of every zone the account sees: their ids (node labels)
    /// and types (load-balancer subnets skip local and wavelength zones), remembered for good.
    /// Callers hold `zone_flight`, so lookups that miss together share the call.
    pub(crate) async fn learn_zones(&self) -> CloudResult<()> {
        let ec2 = self.clients().await?.ec2.clone();
        let out = self
            .call(
                "DescribeAvailabilityZones",
                ec2.describe_availability_zones().send(),
            )
            .await?;
        let mut mem = self.inner.memory.lock();
        for z in out.availability_zones() {
            let Some(name) = z.zone_name() else { continue };
            if let Some(id) = z.zone_id() {
                mem.zone_ids.insert(name.to_string(), id.to_string());
            }
            if let Some(kind) = z.zone_type() {
                mem.zone_types.insert(name.to_string(), kind.to_string());
            }
        }
        Ok(())
    }

    fn metadata(
        &self,
        inst: &Instance,
        region: &str,
        zone_ids: &HashMap<String, String>,
    ) -> InstanceMetadata {
        let zone = zone_of(inst);
        let mut labels = std::collections::BTreeMap::new();
        let zone_id = inst
            .placement()
            .and_then(|p| p.availability_zone_id())
            .map(String::from)
            .or_else(|| zone_ids.get(zone).cloned());
        if let Some(id) = zone_id {
            labels.insert(LABEL_ZONE_ID.to_string(), id);
        }
        InstanceMetadata {
            provider_id: provider_id(zone, inst.instance_id().unwrap_or_default()),
            instance_type: inst
                .instance_type()
                .map(|t| t.as_str().to_string())
                .unwrap_or_default(),
            node_addresses: node_addresses(inst, &self.inner.cfg.node_ip_families),
            zone: zone.to_string(),
            region: region.to_string(),
            additional_labels: labels,
        }
    }

    /// Generic over how the Nodes are held: the batch calls get the controllers' shared Nodes,
    /// the single calls one borrowed Node, and neither is copied.
    async fn metadata_of<N: Borrow<Node>>(
        &self,
        nodes: &[N],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        let found = self.lookup(nodes).await;
        let live: Vec<&Instance> = found
            .iter()
            .filter_map(|r| match r {
                Ok(Lookup::Instance(i)) => Some(&**i),
                _ => None,
            })
            .collect();
        let region = match self.clients().await {
            Ok(c) => c.region.clone(),
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        let zone_ids = match self.zone_ids(&live).await {
            Ok(z) => z,
            Err(e) => return nodes.iter().map(|_| Err(e.clone())).collect(),
        };
        found
            .into_iter()
            .map(|r| match r? {
                Lookup::Instance(inst) if status_of(Some(&inst)).exists => {
                    Ok(Some(self.metadata(&inst, &region, &zone_ids)))
                }
                // Fargate and hybrid Nodes: nothing to initialize from EC2 (the controller
                // logs it at info level and leaves the Node alone).
                Lookup::NotEc2 => Ok(None),
                _ => Err(CloudError::InstanceNotFound),
            })
            .collect()
    }

    async fn statuses_of<N: Borrow<Node>>(&self, nodes: &[N]) -> Vec<CloudResult<InstanceStatus>> {
        self.lookup(nodes)
            .await
            .into_iter()
            .map(|r| {
                r.map(|l| match l {
                    Lookup::Instance(inst) => status_of(Some(&inst)),
                    Lookup::Gone => status_of(None),
                    // Never deleted on a guess: no EC2 instance to say it is gone.
                    Lookup::NotEc2 => InstanceStatus {
                        exists: true,
                        shutdown: false,
                    },
                })
            })
            .collect()
    }
}

#[async_trait]
impl Instances for AwsCloud {
    async fn instance_exists(&self, node: &Node) -> CloudResult<bool> {
        let mut s = self.statuses_of(std::slice::from_ref(node)).await;
        s.pop()
            .unwrap_or(Err(CloudError::InstanceNotFound))
            .map(|s| s.exists)
    }

    async fn instance_shutdown(&self, node: &Node) -> CloudResult<bool> {
        let mut s = self.statuses_of(std::slice::from_ref(node)).await;
        s.pop()
            .unwrap_or(Err(CloudError::InstanceNotFound))
            .map(|s| s.shutdown)
    }

    async fn instance_metadata(&self, node: &Node) -> CloudResult<Option<InstanceMetadata>> {
        let mut m = self.metadata_of(std::slice::from_ref(node)).await;
        m.pop().unwrap_or(Err(CloudError::InstanceNotFound))
    }

    async fn instances_metadata(
        &self,
        nodes: &[Arc<Node>],
    ) -> Vec<CloudResult<Option<InstanceMetadata>>> {
        self.metadata_of(nodes).await
    }

    async fn instances_status(&self, nodes: &[Arc<Node>]) -> Vec<CloudResult<InstanceStatus>> {
        self.statuses_of(nodes).await
    }

    fn native_batching(&self) -> bool {
        true
    }

    fn max_batch_size(&self) -> usize {
        MAX_IDS_PER_CALL
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstanceNetworkInterfaceAttachment,
        InstancePrivateIpAddress, InstanceState,
    };

    fn eni(index: i32, ips: &[&str], v6: &[&str]) -> InstanceNetworkInterface {
        InstanceNetworkInterface::builder()
            .status(NetworkInterfaceStatus::InUse)
            .attachment(
                InstanceNetworkInterfaceAttachment::builder()
                    .device_index(index)
                    .build(),
            )
            .set_private_ip_addresses(Some(
                ips.iter()
                    .map(|ip| {
                        InstancePrivateIpAddress::builder()
                            .private_ip_address(*ip)
                            .build()
                    })
                    .collect(),
            ))
            .set_ipv6_addresses(Some(
                v6.iter()
                    .map(|ip| InstanceIpv6Address::builder().ipv6_address(*ip).build())
                    .collect(),
            ))
            .build()
    }

    #[test]
    fn addresses_follow_upstream_order() {
        let inst = Instance::builder()
            .network_interfaces(eni(1, &["10.0.1.5"], &["2600::2"]))
            .network_interfaces(eni(0, &["10.0.0.5", "10.0.0.6"], &["2600::1", "2600::9"]))
            .public_ip_address("54.1.2.3")
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .public_dns_name("ec2-54-1-2-3.compute-1.amazonaws.com")
            .build();
        let got: Vec<(String, String)> = node_addresses(&inst, &[IpFamily::Ipv4, IpFamily::Ipv6])
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        let want = [
            ("InternalIP", "10.0.0.5"),
            ("InternalIP", "10.0.0.6"),
            ("InternalIP", "10.0.1.5"),
            ("ExternalIP", "54.1.2.3"),
            ("InternalDNS", "ip-10-0-0-5.ec2.internal"),
            ("Hostname", "ip-10-0-0-5.ec2.internal"),
            ("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ("InternalIP", "2600::1"),
            ("InternalIP", "2600::2"),
        ];
        let want: Vec<(String, String)> = want
            .iter()
            .map(|(t, a)| (t.to_string(), a.to_string()))
            .collect();
        assert_eq!(got, want);
        let v6_only = node_addresses(&inst, &[IpFamily::Ipv6]);
        assert_eq!(v6_only.len(), 2);
    }

    #[test]
    fn states_map_to_exists_and_shutdown() {
        let with = |s: InstanceStateName| {
            Instance::builder()
                .state(InstanceState::builder().name(s).build())
                .build()
        };
        let st = |s| status_of(Some(&with(s)));
        assert_eq!(
            st(InstanceStateName::Running),
            InstanceStatus {
                exists: true,
                shutdown: false
            }
        );
        assert_eq!(
            st(InstanceStateName::Stopped),
            InstanceStatus {
                exists: true,
                shutdown: true
            }
        );
        assert_eq!(
            st(InstanceStateName::Stopping),
            InstanceStatus {
                exists: true,
                shutdown: true
            }
        );
        // Not gone yet, as upstream: its Node stays until EC2 says terminated.
        assert_eq!(
            st(InstanceStateName::ShuttingDown),
            InstanceStatus {
                exists: true,
                shutdown: false
            }
        );
        assert_eq!(
            st(InstanceStateName::Terminated),
            InstanceStatus {
                exists: false,
                shutdown: false
            }
        );
        assert_eq!(
            status_of(None),
            InstanceStatus {
                exists: false,
                shutdown: false
            }
        );
    }

    #[test]
    fn not_found_message_names_the_ids() {
        assert_eq!(
            ids_in_message("The instance IDs 'i-0a1, i-0b2' do not exist"),
            vec!["i-0a1", "i-0b2"]
        );
        assert_eq!(
            ids_in_message("The instance ID 'i-9' does not exist"),
            vec!["i-9"]
        );
    }
}
