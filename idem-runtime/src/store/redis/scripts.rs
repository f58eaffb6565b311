//! The Lua scripts, one per protocol step (the `*.lua` files beside this one), each loaded
//! once and run with `EVALSHA`.

use ::redis::Script;

const CLAIM_LUA: &str = include_str!("claim.lua");
const COMPLETE_LUA: &str = include_str!("complete.lua");
const RELEASE_LUA: &str = include_str!("release.lua");
const RENEW_LUA: &str = include_str!("renew.lua");
const GET_LUA: &str = include_str!("get.lua");
const FORCE_RELEASE_LUA: &str = include_str!("force_release.lua");
const MARK_LUA: &str = include_str!("mark.lua");
const PARK_LUA: &str = include_str!("park.lua");
const ABANDON_LUA: &str = include_str!("abandon.lua");
const RESOLVE_LUA: &str = include_str!("resolve.lua");

/// How the scripts tell waiters that a record changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Publish {
    /// `PUBLISH`, on one server.
    Channel,
    /// `SPUBLISH` on a cluster: the channel is named like the key, so it hashes to the key's
    /// slot and the message stays on the shard that owns it (Redis 7.0+).
    ShardChannel,
}

/// The ten scripts, hashed once; `EVALSHA` with a `SCRIPT LOAD` fallback on `NOSCRIPT` (after a
/// server restart or `SCRIPT FLUSH`).
pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    pub(super) renew: Script,
    pub(super) get: Script,
    pub(super) force_release: Script,
    pub(super) mark: Script,
    pub(super) park: Script,
    pub(super) abandon: Script,
    pub(super) resolve: Script,
    /// The source of each, for `SCRIPT LOAD` at open.
    pub(super) sources: [String; 10],
}

impl Scripts {
    pub(super) fn new(publish: Publish) -> Self {
        // One text per script: the cluster's differs only in the publishing command.
        let source = |lua: &str| match publish {
            Publish::Channel => lua.to_owned(),
            // A cluster announces no releases (a `PUBLISH` would be broadcast to every node,
            // an `SPUBLISH` must stay in the key's slot): its scripts drop those lines.
            Publish::ShardChannel => lua
                .lines()
                .filter(|line| !line.ends_with("-- announce"))
                .map(|line| line.replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'") + "\n")
                .collect(),
        };
        let sources = [
            CLAIM_LUA,
            COMPLETE_LUA,
            RELEASE_LUA,
            RENEW_LUA,
            GET_LUA,
            FORCE_RELEASE_LUA,
            MARK_LUA,
            PARK_LUA,
            ABANDON_LUA,
            RESOLVE_LUA,
        ]
        .map(source);
        let [claim, complete, release, renew, get, force_release, mark, park, abandon, resolve] =
            sources.each_ref().map(|code| Script::new(code));
        Scripts {
            claim,
            complete,
            release,
            renew,
            get,
            force_release,
            mark,
            park,
            abandon,
            resolve,
            sources,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_scripts_publish_on_shard_channels_only() {
        let server = Scripts::new(Publish::Channel);
        let cluster = Scripts::new(Publish::ShardChannel);
        let publishing = server
            .sources
            .iter()
            .filter(|s| s.contains("redis.call('PUBLISH'"))
            .count();
        // complete, release, force_release, park and abandon announce a change.
        assert_eq!(publishing, 5);
        for (s, c) in server.sources.iter().zip(&cluster.sources) {
            assert!(
                !c.contains("'PUBLISH'") && !c.contains("\"PUBLISH\""),
                "{c}"
            );
            assert_eq!(s.contains("'PUBLISH'"), c.contains("'SPUBLISH'"));
        }
    }

    /// The scripts that end a record keep it as long as the protocol says.
    #[test]
    fn ended_records_are_kept_for_keep_ended() {
        let keep = format!(
            "redis.call('PEXPIRE', key, {})",
            crate::protocol::KEEP_ENDED.as_millis()
        );
        for script in [RELEASE_LUA, FORCE_RELEASE_LUA, RESOLVE_LUA] {
            assert!(script.contains(&keep), "{script}");
        }
    }
}
