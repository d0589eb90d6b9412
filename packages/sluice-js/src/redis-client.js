// How the Redis store and the pacer's Redis state send a command: node-redis (createClient,
// createCluster) or ioredis (Redis, Cluster), whichever the user connected.

/** Whether `client` is node-redis's Cluster (createCluster), whose sendCommand routes by a key. */
function isNodeRedisCluster(client) {
  return typeof client.nodeClient === 'function' || typeof client.getSlotMaster === 'function';
}

/**
 * `(key, args) => reply` over node-redis (createClient or createCluster, v4 and later) or
 * ioredis (Redis or Cluster, whose `call` routes by the script's key itself).
 */
export function sender(client) {
  if (typeof client?.call === 'function') return (key, args) => client.call(...args);
  if (typeof client?.sendCommand === 'function') {
    if (isNodeRedisCluster(client)) return (key, args) => client.sendCommand(key, false, args);
    return (key, args) => client.sendCommand(args);
  }
  throw new TypeError('client must be a connected node-redis (createClient, createCluster) or ioredis (Redis, Cluster) client');
}
