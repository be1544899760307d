//! Unit tests of Pusher authentication (the parent module), kept apart so that the module reads as
//! its logic alone.

use super::*;
// `::hmac` is the RustCrypto crate (a dev-dependency), not ring's module above.
use ::hmac::{Hmac, Mac};
use sha2::Sha256;

// Pusher's worked example (pusher/docs, library_auth_reference/rest-api.md): app 3.
const EX_KEY: &str = "278d425bdf160c739803";
const EX_SECRET: &str = "7ad3773142a6692b25b8";
const EX_TS: u64 = 1353088179;
const EX_BODY: &[u8] = br#"{"name":"foo","channels":["project-3"],"data":"{\"some\":\"data\"}"}"#;
const EX_MD5: &str = "ec365a775a4cd0599faeb73354201b6f";
const EX_SIG: &str = "da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c";
const EX_PATH: &str = "/apps/3/events";

/// MD5 of the empty body, which the Python SDK sends on every GET.
const EMPTY_MD5: &str = "d41d8cd98f00b204e9800998ecf8427e";

fn ex_query() -> String {
    format!(
            "auth_key={EX_KEY}&auth_timestamp={EX_TS}&auth_version=1.0&body_md5={EX_MD5}&auth_signature={EX_SIG}"
        )
}

/// An HMAC-SHA256 from another implementation (RustCrypto) than the one verifying.
fn rc_sign(secret: &str, msg: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(msg.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// A request signed with `secret` over `params` (no auth_signature yet).
fn signed(method: &str, path: &str, params: &str, secret: &str) -> Query {
    let q = parse_query(params.as_bytes()).unwrap();
    let sig = sign(
        secret.as_bytes(),
        string_to_sign(method, path, &q).as_bytes(),
    );
    parse_query(format!("{params}&auth_signature={sig}").as_bytes()).unwrap()
}

/// The signature a client computes over `params` with `secret` (the reference HMAC).
fn client_signature(method: &str, path: &str, params: &str, secret: &str) -> String {
    let q = parse_query(params.as_bytes()).unwrap();
    rc_sign(secret, &string_to_sign(method, path, &q))
}

/// Sign `params` for `method /p` with `ts_s`, then check that request with `body` at
/// `now` against `ts_s`.
fn check_signed(method: &str, params: &str, body: &[u8], now: u64) -> Result<(), RestAuthError> {
    let q = signed(method, "/p", params, "ts_s");
    check_rest(method, "/p", &q, body, now, &["ts_s"])
}

/// The server's clock in the REST tests (Unix seconds).
const NOW: u64 = 1_700_000_000;

fn rest_params(ts: u64, extra: &str) -> String {
    format!("auth_key=pk_a&auth_timestamp={ts}&auth_version=1.0{extra}")
}

#[test]
fn pushers_worked_example_verifies() {
    let q = parse_query(ex_query().as_bytes()).unwrap();
    assert_eq!(
            string_to_sign("POST", EX_PATH, &q),
            format!("POST\n/apps/3/events\nauth_key={EX_KEY}&auth_timestamp={EX_TS}&auth_version=1.0&body_md5={EX_MD5}")
        );
    assert_eq!(std::str::from_utf8(&md5_hex(EX_BODY)).unwrap(), EX_MD5);
    assert_eq!(
        sign(
            EX_SECRET.as_bytes(),
            string_to_sign("POST", EX_PATH, &q).as_bytes()
        ),
        EX_SIG
    );
    assert_eq!(
        check_rest("POST", EX_PATH, &q, EX_BODY, EX_TS, &[EX_SECRET]),
        Ok(())
    );
    assert_eq!(auth_key(&q), Some(EX_KEY));

    // One byte changed anywhere that is signed or checked refuses it.
    let mut body = EX_BODY.to_vec();
    body[10] ^= 1;
    assert_eq!(
        check_rest("POST", EX_PATH, &q, &body, EX_TS, &[EX_SECRET]),
        Err(RestAuthError::BodyMd5Mismatch)
    );
    for (method, path, secret) in [
        ("PUT", EX_PATH, EX_SECRET),
        ("POST", "/apps/4/events", EX_SECRET),
        ("POST", EX_PATH, "7ad3773142a6692b25b9"),
    ] {
        assert_eq!(
            check_rest(method, path, &q, EX_BODY, EX_TS, &[secret]),
            Err(RestAuthError::Signature),
            "{method} {path} {secret}"
        );
    }
    let other_key = ex_query().replace("auth_key=278d", "auth_key=378d");
    let q = parse_query(other_key.as_bytes()).unwrap();
    assert_eq!(
        check_rest("POST", EX_PATH, &q, EX_BODY, EX_TS, &[EX_SECRET]),
        Err(RestAuthError::Signature)
    );
    let other_sig = ex_query().replace("auth_signature=da45", "auth_signature=da46");
    let q = parse_query(other_sig.as_bytes()).unwrap();
    assert_eq!(
        check_rest("POST", EX_PATH, &q, EX_BODY, EX_TS, &[EX_SECRET]),
        Err(RestAuthError::Signature)
    );
}

#[test]
fn query_parsing() {
    let q = parse_query(b"A=1&b&c=x=y&D=%41%2c%2C+z&&").unwrap();
    let pairs: Vec<_> = q.iter().collect();
    assert_eq!(pairs, [("a", "1"), ("b", ""), ("c", "x=y"), ("d", "A,,+z")]);
    assert_eq!(q.len(), 4);
    assert_eq!(parse_query(b""), Ok(Query::default()));
    // Percent-decoded keys are lowercased too; UTF-8 decodes.
    let q = parse_query(b"%4Bey=caf%C3%A9").unwrap();
    assert_eq!(q.get("key"), Some("café"));

    assert_eq!(
        parse_query(b"a=1&b=2&a=3"),
        Err(QueryError::Duplicate("a".into()))
    );
    assert_eq!(
        parse_query(b"a=1&A=2"),
        Err(QueryError::Duplicate("a".into()))
    );
    assert_eq!(
        parse_query(b"%61=1&a=2"),
        Err(QueryError::Duplicate("a".into()))
    );
    assert_eq!(parse_query(b"a=%"), Err(QueryError::Percent));
    assert_eq!(parse_query(b"a=%4"), Err(QueryError::Percent));
    assert_eq!(parse_query(b"a=%zz"), Err(QueryError::Percent));
    assert_eq!(parse_query(b"a=%C3"), Err(QueryError::Utf8));
    assert_eq!(parse_query(b"a=\xff"), Err(QueryError::Utf8));

    let many: Vec<String> = (0..MAX_PARAMS).map(|i| format!("p{i}=v")).collect();
    assert_eq!(
        parse_query(many.join("&").as_bytes()).unwrap().len(),
        MAX_PARAMS
    );
    let too_many = format!("{}&x=1", many.join("&"));
    assert_eq!(parse_query(too_many.as_bytes()), Err(QueryError::TooMany));
}

#[test]
fn string_to_sign_sorts_lowercases_and_keeps_values_unescaped() {
    let q = parse_query(b"info=user_count%2Csubscription_count&Filter_By_Prefix=presence-&auth_signature=x&auth_key=k&b=a+b%20c").unwrap();
    assert_eq!(
            string_to_sign("GET", "/apps/1/channels", &q),
            "GET\n/apps/1/channels\nauth_key=k&b=a+b c&filter_by_prefix=presence-&info=user_count,subscription_count"
        );
    // Sorted bytewise: '_' (0x5f) sorts before 'a'..'z' but after digits.
    let q = parse_query(b"ab=1&a_b=2&a1=3&a=4").unwrap();
    assert_eq!(
        string_to_sign("GET", "/", &q),
        "GET\n/\na=4&a1=3&a_b=2&ab=1"
    );
}

#[test]
fn plus_and_encoded_comma_are_signed_as_decoded() {
    // The signer signed `info=user_count,subscription_count` and `tag=a+b`; the request
    // carries the comma escaped and the plus as is.
    let params = rest_params(NOW, "&info=user_count,subscription_count&tag=a+b");
    let sig = client_signature("GET", "/apps/1/channels", &params, "ts_s");
    let wire = format!(
        "{}&info=user_count%2Csubscription_count&tag=a+b&auth_signature={sig}",
        rest_params(NOW, "")
    );
    let q = parse_query(wire.as_bytes()).unwrap();
    assert_eq!(q.get("tag"), Some("a+b"));
    assert_eq!(
        check_rest("GET", "/apps/1/channels", &q, b"", NOW, &["ts_s"]),
        Ok(())
    );
    // `+` read as a space would have signed something else.
    let spaced = wire.replace("tag=a+b", "tag=a%20b");
    let q = parse_query(spaced.as_bytes()).unwrap();
    assert_eq!(
        check_rest("GET", "/apps/1/channels", &q, b"", NOW, &["ts_s"]),
        Err(RestAuthError::Signature)
    );
}

#[test]
fn required_parameters_and_version() {
    for missing in [
        "auth_key",
        "auth_timestamp",
        "auth_version",
        "auth_signature",
    ] {
        let q = signed("GET", "/p", &rest_params(NOW, ""), "ts_s");
        let kept: Vec<String> = q
            .iter()
            .filter(|(k, _)| *k != missing)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let q = parse_query(kept.join("&").as_bytes()).unwrap();
        assert_eq!(
            check_rest("GET", "/p", &q, b"", NOW, &["ts_s"]),
            Err(RestAuthError::Missing(missing))
        );
    }
    let params = format!("auth_key=pk_a&auth_timestamp={NOW}&auth_version=2.0");
    assert_eq!(
        check_signed("GET", &params, b"", NOW),
        Err(RestAuthError::Version)
    );
}

#[test]
fn timestamp_window_is_600_s_each_way() {
    for ts in [NOW - 600, NOW + 600, NOW] {
        assert_eq!(
            check_signed("GET", &rest_params(ts, ""), b"", NOW),
            Ok(()),
            "{ts}"
        );
    }
    for ts in [NOW - 601, NOW + 601, 0] {
        assert_eq!(
            check_signed("GET", &rest_params(ts, ""), b"", NOW),
            Err(RestAuthError::TimestampWindow),
            "{ts}"
        );
    }
    for bad in [
        "",
        "-1",
        "+1700000000",
        "1700000000.5",
        "1234567890123",
        "17e8",
    ] {
        let params = format!("auth_key=pk_a&auth_timestamp={bad}&auth_version=1.0");
        assert_eq!(
            check_signed("GET", &params, b"", NOW),
            Err(RestAuthError::TimestampFormat),
            "{bad:?}"
        );
    }
}

#[test]
fn body_md5_rules() {
    assert_eq!(std::str::from_utf8(&md5_hex(b"")).unwrap(), EMPTY_MD5);
    let md5 = "99914b932bd37a50b983c5e7c90ae93b"; // of `{}`
    let given = |md5: &str| format!("&body_md5={md5}");
    use RestAuthError::{BodyMd5Mismatch, BodyMd5Missing};
    for (method, extra, body, expected) in [
        // The Python SDK's GET: body_md5 of the empty body, signed.
        ("GET", given(EMPTY_MD5), &b""[..], Ok(())),
        // No body, no body_md5: fine on any method.
        ("POST", String::new(), b"", Ok(())),
        ("POST", String::new(), b"{}", Err(BodyMd5Missing)),
        ("POST", given(md5), b"{}", Ok(())),
        // The right MD5, but in uppercase, or cut short: not the lowercase hex MD5.
        (
            "POST",
            given(&md5.to_uppercase()),
            b"{}",
            Err(BodyMd5Mismatch),
        ),
        ("POST", given(&md5[..31]), b"{}", Err(BodyMd5Mismatch)),
        ("POST", given(""), b"{}", Err(BodyMd5Mismatch)),
    ] {
        assert_eq!(
            check_signed(method, &rest_params(NOW, &extra), body, NOW),
            expected,
            "{method} {extra:?}"
        );
    }
}

#[test]
fn signature_format_case_and_rotation() {
    let params = rest_params(NOW, "");
    let sig = client_signature("GET", "/p", &params, "ts_new");
    let with =
        |sig: &str| parse_query(format!("{params}&auth_signature={sig}").as_bytes()).unwrap();

    assert_eq!(
        check_rest("GET", "/p", &with(&sig), b"", NOW, &["ts_new"]),
        Ok(())
    );
    assert_eq!(
        check_rest(
            "GET",
            "/p",
            &with(&sig.to_uppercase()),
            b"",
            NOW,
            &["ts_new"]
        ),
        Ok(())
    );
    // During a rotation's grace both secrets are in force, newest first.
    assert_eq!(
        check_rest("GET", "/p", &with(&sig), b"", NOW, &["ts_newer", "ts_new"]),
        Ok(())
    );
    assert_eq!(
        check_rest("GET", "/p", &with(&sig), b"", NOW, &["ts_newer"]),
        Err(RestAuthError::Signature)
    );
    assert_eq!(
        check_rest("GET", "/p", &with(&sig), b"", NOW, &[]),
        Err(RestAuthError::NoSecret)
    );
    for bad in [
        &sig[..63],
        &format!("{sig}0"),
        &format!("{}g", &sig[..63]),
        "",
    ] {
        assert_eq!(
            check_rest("GET", "/p", &with(bad), b"", NOW, &["ts_new"]),
            Err(RestAuthError::SignatureFormat),
            "{bad:?}"
        );
    }
}

#[test]
fn messages_never_carry_expected_values() {
    let all = [
        RestAuthError::Missing("auth_key").to_string(),
        RestAuthError::Version.to_string(),
        RestAuthError::TimestampFormat.to_string(),
        RestAuthError::TimestampWindow.to_string(),
        RestAuthError::BodyMd5Mismatch.to_string(),
        RestAuthError::BodyMd5Missing.to_string(),
        RestAuthError::SignatureFormat.to_string(),
        RestAuthError::NoSecret.to_string(),
        RestAuthError::UnknownApp.to_string(),
        RestAuthError::Signature.to_string(),
        ChannelAuthError::Malformed.to_string(),
        ChannelAuthError::NoSecret.to_string(),
        ChannelAuthError::Signature.to_string(),
    ];
    for m in &all {
        // No digest or signature (a run of hex digits) and no secret.
        let longest_hex_run = m
            .split(|c: char| !c.is_ascii_hexdigit())
            .map(str::len)
            .max()
            .unwrap_or(0);
        assert!(longest_hex_run < 8 && !m.contains("ts_"), "{m}");
    }
    // One message for every refusal that depends on the app.
    let signature = RestAuthError::Signature.to_string();
    assert!(signature.starts_with("invalid signature"), "{signature}");
    assert_eq!(RestAuthError::UnknownApp.to_string(), signature);
    assert_eq!(RestAuthError::NoSecret.to_string(), signature);
    assert!(RestAuthError::TimestampWindow
        .to_string()
        .starts_with("auth_timestamp is more than 600 s from server time"));
}

#[test]
fn channel_auth_private_and_presence() {
    let socket = "2914375612.4398046511105";
    let sig = rc_sign("ts_s", &format!("{socket}:private-orders"));
    let auth = format!("pk_ab:{sig}");
    assert_eq!(
        check_channel_auth(&auth, socket, "private-orders", None, &["ts_s"]),
        Ok("pk_ab")
    );
    assert_eq!(
        check_channel_auth(
            &format!("pk_ab:{}", sig.to_uppercase()),
            socket,
            "private-orders",
            None,
            &["ts_s"]
        ),
        Ok("pk_ab")
    );
    // Another channel, socket or secret: refused.
    assert_eq!(
        check_channel_auth(&auth, socket, "private-other", None, &["ts_s"]),
        Err(ChannelAuthError::Signature)
    );
    assert_eq!(
        check_channel_auth(&auth, "1.2", "private-orders", None, &["ts_s"]),
        Err(ChannelAuthError::Signature)
    );
    assert_eq!(
        check_channel_auth(&auth, socket, "private-orders", None, &["ts_x"]),
        Err(ChannelAuthError::Signature)
    );
    // Rotation: the previous secret still verifies while in force.
    assert_eq!(
        check_channel_auth(&auth, socket, "private-orders", None, &["ts_x", "ts_s"]),
        Ok("pk_ab")
    );
    assert_eq!(
        check_channel_auth(&auth, socket, "private-orders", None, &[]),
        Err(ChannelAuthError::NoSecret)
    );

    // Presence: channel_data is signed byte for byte, whatever its JSON spacing.
    let node = r#"{"user_id":"u1","user_info":{"name":"Ann"}}"#;
    let python = r#"{"user_id": "u1", "user_info": {"name": "Ann"}}"#;
    for data in [node, python] {
        let sig = rc_sign("ts_s", &format!("{socket}:presence-room:{data}"));
        let auth = format!("pk_ab:{sig}");
        assert_eq!(
            check_channel_auth(&auth, socket, "presence-room", Some(data), &["ts_s"]),
            Ok("pk_ab"),
            "{data}"
        );
        let other = if data == node { python } else { node };
        assert_eq!(
            check_channel_auth(&auth, socket, "presence-room", Some(other), &["ts_s"]),
            Err(ChannelAuthError::Signature)
        );
        assert_eq!(
            check_channel_auth(&auth, socket, "presence-room", None, &["ts_s"]),
            Err(ChannelAuthError::Signature)
        );
    }
}

#[test]
fn channel_auth_shape() {
    let socket = "1.2";
    let sig = rc_sign("ts_s", "1.2:private-a");
    // Split at the last ':' so a key part with a ':' stays whole (and is the caller's
    // to refuse as unknown).
    assert_eq!(
        check_channel_auth(&format!("a:b:{sig}"), socket, "private-a", None, &["ts_s"]),
        Ok("a:b")
    );
    for bad in [
        sig.clone(),
        format!(":{sig}"),
        format!("pk_a:{}", &sig[..63]),
        format!("pk_a:{sig}0"),
        format!("pk_a:{}z", &sig[..63]),
        format!("pk_a:{sig}:"),
        String::new(),
    ] {
        assert_eq!(
            check_channel_auth(&bad, socket, "private-a", None, &["ts_s"]),
            Err(ChannelAuthError::Malformed),
            "{bad:?}"
        );
    }
}

#[test]
fn sign_is_lowercase_hex_hmac_sha256() {
    let s = sign(b"ts_secret", b"body");
    assert_eq!(s, rc_sign("ts_secret", "body"));
    assert_eq!(s.len(), 64);
    assert!(s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
}

#[test]
fn user_auth_signs_socket_id_user_user_data() {
    let socket = "1234.5678";
    let data = r#"{"id":"ann","user_info":{"name":"Ann"}}"#;
    let sig = rc_sign("ts_s", &format!("{socket}::user::{data}"));
    let auth = format!("pk_ab:{sig}");
    assert_eq!(check_user_auth(&auth, socket, data, &["ts_s"]), Ok("pk_ab"));
    assert_eq!(
        check_user_auth(&auth, "1234.5679", data, &["ts_s"]),
        Err(ChannelAuthError::Signature)
    );
    assert_eq!(
        check_user_auth(&auth, socket, r#"{"id":"bob"}"#, &["ts_s"]),
        Err(ChannelAuthError::Signature)
    );
    // A channel authorisation of a channel named "user" is not a user authorisation.
    let channel_sig = rc_sign("ts_s", &format!("{socket}:user"));
    assert_eq!(
        check_user_auth(&format!("pk_ab:{channel_sig}"), socket, data, &["ts_s"]),
        Err(ChannelAuthError::Signature)
    );
}
