//! Unit tests of the publish body parser (the parent module), kept apart so that the
//! module reads as its logic alone.

use super::*;

fn parse(body: &str) -> Result<(String, String, String), ApiError> {
    let mut p = PublishParser::new();
    let m = p.parse(body.as_bytes())?;
    Ok((
        m.channel().to_string(),
        m.event.to_string(),
        String::from_utf8(m.data.to_vec()).unwrap(),
    ))
}

#[test]
fn valid_publish_keeps_data_verbatim() {
    let (c, e, d) = parse(
            r#"{"channel":"news","event":"order.created","data":{"b":1.50,"a":[1,{"x":"}"}]},"extra":true}"#,
        )
        .unwrap();
    assert_eq!(c, "news");
    assert_eq!(e, "order.created");
    assert_eq!(d, r#"{"b":1.50,"a":[1,{"x":"}"}]}"#);
    let (_, _, d) = parse(r#"{ "data" : "hi \"there\"" , "channel":"c","event":"e"}"#).unwrap();
    assert_eq!(d, r#""hi \"there\"""#);
}

#[test]
fn nested_values_before_fields_are_skipped() {
    let (c, _, d) = parse(
        r#"{"x":{"channel":"no","y":[{"z":1},[2,3]]},"channel":"yes","event":"e","data":"d"}"#,
    )
    .unwrap();
    assert_eq!(c, "yes");
    assert_eq!(d, r#""d""#);
}

#[test]
fn every_400_case() {
    assert_eq!(parse("not json"), Err(ApiError::InvalidJson));
    assert_eq!(parse("[1,2]"), Err(ApiError::NotAnObject));
    assert_eq!(parse(r#""str""#), Err(ApiError::NotAnObject));
    assert_eq!(
        parse(r#"{"event":"e","data":{}}"#),
        Err(ApiError::MissingField("channel"))
    );
    assert_eq!(
        parse(r#"{"channel":"c","data":{}}"#),
        Err(ApiError::MissingField("event"))
    );
    assert_eq!(
        parse(r#"{"channel":"c","event":"e"}"#),
        Err(ApiError::MissingField("data"))
    );
    assert!(matches!(
        parse(r#"{"channel":1,"event":"e","data":{}}"#),
        Err(ApiError::InvalidField("channel", _))
    ));
    for bad in ["1", "null", "[1]", "true"] {
        let body = format!(r#"{{"channel":"c","event":"e","data":{bad}}}"#);
        assert!(matches!(
            parse(&body),
            Err(ApiError::InvalidField("data", _))
        ));
    }
    assert!(matches!(
        parse(r#"{"channel":"","event":"e","data":{}}"#),
        Err(ApiError::InvalidField("channel", _))
    ));
    assert!(matches!(
        parse(r#"{"channel":"a\u0001b","event":"e","data":{}}"#),
        Err(ApiError::InvalidField("channel", _))
    ));
    let long = "a".repeat(101);
    assert_eq!(
        parse(&format!(
            r#"{{"channel":"{long}","event":"e","data":{{}}}}"#
        )),
        Err(ApiError::FieldTooLong("channel"))
    );
}

#[test]
fn lengths_count_characters_not_bytes() {
    let ok = "é".repeat(100);
    assert!(parse(&format!(r#"{{"channel":"{ok}","event":"e","data":"x"}}"#)).is_ok());
    let too_long = "é".repeat(101);
    assert_eq!(
        parse(&format!(
            r#"{{"channel":"c","event":"{too_long}","data":"x"}}"#
        )),
        Err(ApiError::FieldTooLong("event"))
    );
}

#[test]
fn duplicate_keys_last_wins_and_escaped_keys_match() {
    let (_, _, d) =
        parse(r#"{"channel":"c","event":"e","data":"first","d\u0061ta":{"k":2}}"#).unwrap();
    assert_eq!(d, r#"{"k":2}"#);
}

#[test]
fn parser_is_reusable() {
    let mut p = PublishParser::new();
    for i in 0..100 {
        let body = format!(r#"{{"channel":"c{i}","event":"e","data":{{"i":{i}}}}}"#);
        let m = p.parse(body.as_bytes()).unwrap();
        assert_eq!(m.channel(), format!("c{i}"));
    }
}

fn invalid(r: Result<(String, String, String), ApiError>, field: &str) {
    match r {
        Err(ApiError::InvalidField(f, _)) => assert_eq!(f, field),
        other => panic!("expected invalid {field}, got {other:?}"),
    }
}

#[test]
fn channels_are_distinct_valid_names_and_exclusive_with_channel() {
    let mut p = PublishParser::new();
    let m = p
        .parse(br#"{"channels":["a","b","c"],"event":"e","data":{}}"#)
        .unwrap();
    assert_eq!(m.channels.as_slice(), &["a", "b", "c"]);
    assert!(!m.channels.is_single());
    invalid(
        parse(r#"{"channels":["a","a"],"event":"e","data":{}}"#),
        "channels",
    );
    invalid(
        parse(r#"{"channels":[],"event":"e","data":{}}"#),
        "channels",
    );
    invalid(
        parse(r#"{"channels":"a","event":"e","data":{}}"#),
        "channels",
    );
    invalid(
        parse(r#"{"channels":["a",1],"event":"e","data":{}}"#),
        "channels",
    );
    invalid(
        parse(r#"{"channels":[""],"event":"e","data":{}}"#),
        "channels",
    );
    invalid(
        parse(r#"{"channel":"a","channels":["b"],"event":"e","data":{}}"#),
        "channels",
    );
    assert_eq!(
        parse(r#"{"event":"e","data":{}}"#),
        Err(ApiError::MissingField("channel"))
    );
    let hundred: Vec<String> = (0..100).map(|i| format!("\"c{i}\"")).collect();
    let body = format!(
        r#"{{"channels":[{}],"event":"e","data":1}}"#,
        hundred.join(",")
    );
    invalid(parse(&body), "data");
    let body = format!(
        r#"{{"channels":[{}],"event":"e","data":"x"}}"#,
        hundred.join(",")
    );
    assert!(parse(&body).is_ok());
    let body = format!(
        r#"{{"channels":[{},"c100"],"event":"e","data":"x"}}"#,
        hundred.join(",")
    );
    invalid(parse(&body), "channels");
    let long = "a".repeat(101);
    assert_eq!(
        parse(&format!(
            r#"{{"channels":["{long}"],"event":"e","data":"x"}}"#
        )),
        Err(ApiError::FieldTooLong("channels"))
    );
}

#[test]
fn reserved_event_names_are_refused() {
    for e in ["pusher:subscribe", "pusher_internal:member_added"] {
        invalid(
            parse(&format!(r#"{{"channel":"c","event":"{e}","data":"x"}}"#)),
            "event",
        );
    }
    assert!(parse(r#"{"channel":"c","event":"pusherx:y","data":"x"}"#).is_ok());
}

const LIMITS: BatchLimits = BatchLimits {
    max_messages: 3,
    max_message_bytes: 64,
};

#[test]
fn a_batch_is_parsed_whole_with_each_data_verbatim() {
    let mut p = PublishParser::new();
    let body = br#"{"messages":[ {"channel":"a","event":"e","data":{"x":[1, "]"]}} ,
            {"data":"s\"q","channels":["b","c"],"event":"f"},{"channel":"a","event":"g","data":{}}],"x":1}"#;
    let msgs = p.parse_batch(body, LIMITS).unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(msgs[0].data, br#"{"x":[1, "]"]}"#);
    assert_eq!(msgs[1].channels.as_slice(), &["b", "c"]);
    assert_eq!(msgs[1].data, br#""s\"q""#);
    assert_eq!(msgs[2].event, "g");
}

#[test]
fn each_format_reads_its_own_keys_and_ignores_the_others() {
    let mut p = PublishParser::new();
    // Pusher's `name` and `info` mean nothing to the native API (an `info` of any kind).
    let m = p
        .parse(br#"{"channel":"a","name":"n","event":"e","info":7,"data":{}}"#)
        .unwrap();
    assert_eq!(m.event, "e");
    // And the native `event` nothing to Pusher's.
    let e = p
        .parse_pusher(br#"{"channel":"a","event":"pusher:x","name":"n","data":"1"}"#)
        .unwrap();
    assert_eq!((e.msg.event, e.info), ("n", None));
    assert_eq!(
        p.parse(br#"{"channel":"a","name":"n","data":{}}"#)
            .unwrap_err(),
        ApiError::MissingField("event")
    );
}

#[test]
fn batch_errors_name_the_first_bad_message() {
    let mut p = PublishParser::new();
    let mut batch = |body: &str| p.parse_batch(body.as_bytes(), LIMITS).map(|m| m.len());
    let err = batch(
        r#"{"messages":[{"channel":"a","event":"e","data":{}},{"channel":"a","event":"e"}]}"#,
    )
    .unwrap_err();
    assert_eq!(err.index, Some(1));
    assert_eq!(err.error, ApiError::MissingField("data"));
    let err = batch(r#"{"messages":[{"channel":"a","event":"e","data":{}},3]}"#).unwrap_err();
    assert_eq!((err.index, err.error), (Some(1), ApiError::NotAnObject));
    let err = batch(r#"{"messages":[]}"#).unwrap_err();
    assert_eq!(err.index, None);
    assert!(matches!(err.error, ApiError::InvalidField("messages", _)));
    let four = r#"{"channel":"a","event":"e","data":{}}"#;
    let err = batch(&format!(r#"{{"messages":[{four},{four},{four},{four}]}}"#)).unwrap_err();
    assert_eq!(err.index, None);
    assert_eq!(
        batch(&format!(r#"{{"messages":[{four},{four},{four}]}}"#)),
        Ok(3)
    );
    let err = batch(r#"{"msgs":[]}"#).unwrap_err();
    assert_eq!(err.error, ApiError::MissingField("messages"));
    let err = batch(r#"{"messages":{}}"#).unwrap_err();
    assert!(matches!(err.error, ApiError::InvalidField("messages", _)));
    let err = batch("[1]").unwrap_err();
    assert_eq!(err.error, ApiError::NotAnObject);
    let err = batch("{").unwrap_err();
    assert_eq!((err.index, err.error), (None, ApiError::InvalidJson));
    let big = format!(
        r#"{{"channel":"a","event":"e","data":"{}"}}"#,
        "x".repeat(40)
    );
    let err = batch(&format!(r#"{{"messages":[{four},{big}]}}"#)).unwrap_err();
    assert_eq!((err.index, err.error), (Some(1), ApiError::PayloadTooLarge));
}

#[test]
fn array_elements_walks_nested_values() {
    let text = br#"[ {"a":[1,2]} , "x,]" ,3,[ ] ]"#;
    let spans: Vec<_> = array_elements(text, 0..text.len())
        .map(|r| std::str::from_utf8(&text[r]).unwrap().to_string())
        .collect();
    assert_eq!(spans, [r#"{"a":[1,2]}"#, r#""x,]""#, "3", "[ ]"]);
    assert_eq!(array_elements(b"[]", 0..2).count(), 0);
}

#[test]
fn malformed_long_numbers_are_invalid_json() {
    // simd-json accepts each of these `data` values (its path for long numbers does
    // not look at what follows the digits).
    for data in [
        r#"{"a":[2522222222222222222x]}"#,
        r#"{"a":[2.5222222222222222222222-;2]}"#,
        r#"{"a":[2.5222222222222222222222x]}"#,
        r#"{"a":[2.5222222222222222222222e5x]}"#,
        r#"{"a":2522222222222222222x}"#,
    ] {
        let body = format!(r#"{{"channel":"news","event":"e","data":{data}}}"#);
        assert!(
            matches!(parse(&body), Err(ApiError::InvalidJson)),
            "accepted {body}"
        );
        let batch = format!(r#"{{"messages":[{body}]}}"#);
        let mut p = PublishParser::new();
        assert!(
            p.parse_batch(
                batch.as_bytes(),
                BatchLimits {
                    max_messages: 10,
                    max_message_bytes: 1 << 16
                }
            )
            .is_err(),
            "batch accepted {batch}"
        );
    }
    // Long but well-formed numbers stay accepted, verbatim.
    for data in [
        r#"{"a":[2.5222222222222222222222,-0,1e5,1E+5,-1.5e-7,25222222222222222222222]}"#,
        r#"{"a":2522222222222222222 }"#,
    ] {
        let body = format!(r#"{{"channel":"news","event":"e","data":{data}}}"#);
        let (_, _, d) = parse(&body).expect(&body);
        assert_eq!(d, data);
    }
}
